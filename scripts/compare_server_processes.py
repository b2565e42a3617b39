"""Wall time and CPU seconds per vLLM process (API server, engine core, worker) for the same
load on several `dflash serve` configurations, all up at once, their runs alternating.

Where `dflash bench` says how fast each configuration is, this says where the CPU went, which
is what tells an extra round trip (engine core and worker both busier per token) from extra
model work (worker only). Each configuration is a `dflash bench` row, optionally followed by
`|` and engine arguments for that row only:

  python scripts/compare_server_processes.py OUT.json none 'dflash[DFLASH_DRAFT_POLICY=off]' \
      'dflash[DFLASH_DRAFT_POLICY=off]|--distributed-executor-backend=mp' -- 4 2 [engine args]

(concurrency levels as a comma list, runs per level; 16 built-in prompts x 128 tokens, T=0).
With PYSPY=1 it also samples each run's engine core and worker with py-spy (raw stacks next to
OUT.json).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from argparse import Namespace
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import psutil

from dflash_cli.commands import bench as bench_command
from dflash_cli.serving import bench, flags

NUM_PROMPTS = 16
MAX_TOKENS = 128


def process_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of a server's process tree, keyed by "pid:title"."""
    seconds = {}
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            title = " ".join(process.cmdline())[:40]
            seconds[f"{process.pid}:{title}"] = times.user + times.system
        except psutil.Error:
            pass
    return seconds


def start_profilers(server, label: str, out: Path) -> list[subprocess.Popen]:
    spies = []
    for child in psutil.Process(server.process.pid).children(recursive=True):
        title = " ".join(child.cmdline())
        for role in ("EngineCore", "Worker"):
            if role in title:
                spies.append(subprocess.Popen(
                    ["py-spy", "record", "-p", str(child.pid), "-r", "100", "--nonblocking",
                     "-f", "raw", "-o", str(out.with_name(f"{out.stem}.{label}.{role}.txt"))],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    split = argv.index("--")
    rows, (concurrency_levels, repeats, *engine_args) = argv[1:split], argv[split + 1:]
    args = Namespace(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=False,
                     request_timeout=600, server_timeout=900, num_prompts=NUM_PROMPTS)
    base = replace(flags.ServeOptions(engine_args=engine_args), host="127.0.0.1", port=0)
    prompts = bench_command._prompts_for(bench.read_prompts(None), NUM_PROMPTS)
    results = []
    with ExitStack() as stack:
        servers = {}
        for row in rows:
            name, _, extra = row.partition("|")
            opts = bench_command._row_options(base, bench_command.parse_algorithm(name))
            opts = flags.resolve(replace(opts, engine_args=[*opts.engine_args, *extra.split()]))
            servers[row] = stack.enter_context(bench_command._started(row, opts, args, out))
        for server, model in servers.values():
            bench_command._warm_up(server.base_url, model, prompts, args)
        for concurrency, run in ((c, r) for c in concurrency_levels.split(",")
                                 for r in range(int(repeats))):
            for index, (row, (server, model)) in enumerate(servers.items()):
                label = f"{index}-c{concurrency}-{run}"
                spies = start_profilers(server, label, out) if os.environ.get("PYSPY") else []
                cpu_before = process_cpu_seconds(server.process.pid)
                counters_before = bench.scrape_counters(server.base_url)
                done, wall = asyncio.run(bench.run_point(
                    server.base_url, model, prompts, int(concurrency),
                    max_tokens=MAX_TOKENS, temperature=0.0))
                cpu_after = process_cpu_seconds(server.process.pid)
                counters_after = bench.scrape_counters(server.base_url)
                for spy in spies:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
                tokens = sum(r.output_tokens for r in done if r.ok)
                result = dict(row=row, run=run, concurrency=int(concurrency),
                              wall_s=round(wall, 2), output_tokens=tokens,
                              output_tokens_per_s=round(tokens / wall, 2),
                              cpu_s={k: round(v - cpu_before.get(k, 0.0), 2)
                                     for k, v in cpu_after.items()},
                              counters={k: counters_after[k] - counters_before[k]
                                        for k in counters_after})
                print(json.dumps(result), flush=True)
                results.append(result)
    out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
