"""Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, streaming, /v1/models,
/metrics) with DFlash speculative decoding, taking SGLang-style flags on either engine.

With --engine vllm (the default) the flags become a `vllm serve` command line (DFlash as
`--speculative-config '{"method": "dflash", ...}'`) and vLLM's own server runs it. With no model
given it serves the embedded default: SmolLM2-135M-Instruct with the shipped drafter. Arguments
this command does not know, and everything after `--`, go to the engine unchanged, e.g.
`dflash serve -- --enforce-eager --max-num-seqs 8`.

On the CPU build of vLLM the server gets a fixed 2 GiB KV cache (VLLM_CPU_KVCACHE_SPACE) unless
a memory flag is given, and vLLM's default thread binding: the model's OpenMP threads on all cores
but one, which is left to the API server and the engine-core loop. The first start compiles the
model (about 2 minutes on 2 cores; cached in ~/.cache/vllm afterwards).
"""

from __future__ import annotations

import signal
import sys

from dflash_cli.serving import flags
from dflash_cli.serving.server import Server, ServerExited

HELP = "OpenAI-compatible server with DFlash speculative decoding (vLLM or SGLang)"


def add_arguments(p):
    flags.add_flag_arguments(p)
    p.add_argument("--print-command", action="store_true",
                   help="print the engine command line and exit without starting it")
    p.add_argument("--ready-timeout", type=float, default=1800.0,
                   help="seconds to wait for the server to answer /health before giving up on "
                        "printing the ready message")
    flags.accept_engine_args(p)


def usage_hint(launch: flags.Launch, opts: flags.ServeOptions) -> str:
    from dflash_cli.serving.server import local_url

    url = local_url(launch.host, launch.port)
    spec = opts.speculative_algorithm
    if spec != "NONE":
        spec += f", {opts.speculative_num_draft_tokens} tokens per block"
    body = ('{"model": "%s", "messages": [{"role": "user", "content": "Write a haiku about '
            'speed."}], "max_tokens": 64}' % launch.model_name)
    return "\n".join([
        f"[dflash] ready: {url}/v1  (model {launch.model_name!r}; speculation: {spec})",
        f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'",
        f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='EMPTY'); "
        f"print(c.chat.completions.create(model='{launch.model_name}', messages=[{{'role': 'user', "
        f"'content': 'Hi!'}}]).choices[0].message.content)\"",
        f"  curl -s {url}/metrics | grep spec_decode     # drafted / accepted token counters",
        "  Ctrl-C stops the server.",
    ])


def run(args) -> int:
    opts = flags.resolve(flags.options_from_args(args))
    launch = flags.build_launch(opts)
    if args.print_command:
        print(launch.shell_command())
        return 0
    print(f"[dflash] starting: {launch.shell_command()}", file=sys.stderr, flush=True)
    server = Server(launch).start()
    stops = []

    def forward(signum, _frame):  # first signal: graceful stop; second: kill
        stops.append(signum)
        server.signal(signal.SIGTERM if len(stops) == 1 else signal.SIGKILL)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        server.wait_ready(args.ready_timeout)
        print(usage_hint(launch, opts), file=sys.stderr, flush=True)
    except ServerExited:
        pass
    except TimeoutError as err:
        print(f"[dflash] {err}; still waiting for the server process", file=sys.stderr)
    code = server.process.wait()
    server.stop(grace=10)
    if stops and code in (0, -signal.SIGTERM, -signal.SIGKILL):
        return 0  # stopped on request
    return code if code > 0 else 1 if code else 0
