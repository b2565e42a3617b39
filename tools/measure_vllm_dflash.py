"""Step costs and tokens/s of vLLM with the dflash plugin, vLLM's native DFlash, or no
speculation, at several batch sizes (offline `LLM.generate`, greedy, ignore_eos).

One engine per run (start-up compiles; cached afterwards):
  python tools/measure_vllm_dflash.py none
  python tools/measure_vllm_dflash.py plugin --draft DRAFT [--policy adaptive|full|off]
  python tools/measure_vllm_dflash.py native --draft DRAFT        # VLLM_PLUGINS excludes us

Besides wall-clock tokens/s it reports tokens per CPU-second of the engine's processes, which
moves much less than wall time on a machine shared with other jobs. Results are appended as
JSON lines to --out. With an untrained drafter every step yields one token per request, so
1 / (steps per second) is the step cost the policy's cost model describes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["none", "plugin", "native"])
    parser.add_argument("--draft", help="drafter folder (plugin / native)")
    parser.add_argument("--target", help="target folder (default: the embedded SmolLM2)")
    parser.add_argument("--policy", default="adaptive", help="DFLASH_DRAFT_POLICY for plugin")
    parser.add_argument("--k", type=int, default=15, help="num_speculative_tokens")
    parser.add_argument("--batches", default="1,4,16,32")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--prompts-file",
                        help="chat prompts (JSONL, `turns`) instead of the synthetic ones: "
                             "answered in groups of each batch size, up to --tokens or EOS, so "
                             "steps draft and accept what serving these prompts would")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--eager", action="store_true", help="no torch.compile")
    parser.add_argument("--executor", help="distributed_executor_backend (default: vLLM's; "
                        "vllm_ext.executor.DraftIdsWithOutputExecutor as dflash serve runs it)")
    parser.add_argument("--spec-extra", type=json.loads, default={},
                        help='more speculative_config fields as JSON, e.g. '
                             '\'{"disable_padded_drafter_batch": true}\'')
    parser.add_argument("--engine-args", type=json.loads, default={},
                        help='engine arguments over the defaults, as JSON, e.g. '
                             '\'{"max_model_len": 8192, "max_num_seqs": 256}\' (as a server)')
    parser.add_argument("--phases", action="store_true",
                        help="time the engine step's phases (tools/phase_times.py); runs the "
                             "engine core and the worker in this process")
    parser.add_argument("--aux-layers",
                        help="none with --phases only: the target also returns these layers' "
                             "hidden states, as a drafter's target does (e.g. 2,9,15,21,28), "
                             "to price those outputs alone")
    parser.add_argument("--out", default="measure_vllm_dflash.jsonl")
    return parser.parse_args(argv)


def configure_env(args):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.mode == "native":
        os.environ["VLLM_PLUGINS"] = ""  # a list that names no plugin
    if args.mode == "plugin":
        os.environ["DFLASH_DRAFT_POLICY"] = args.policy
    if args.phases:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def add_aux_outputs(layers: tuple[int, ...]):
    """Make the in-process CPU model runner ask the target for `layers`' hidden states, which a
    plain engine never does, so its forward can be timed with and without them."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    load = CPUModelRunner.load_model

    def load_model(self, *args, **kwargs):
        self.use_aux_hidden_state_outputs = True
        return load(self, *args, **kwargs)

    CPUModelRunner.load_model = load_model
    CPUModelRunner._get_eagle3_aux_layers_from_config = lambda self: layers


def engine_cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by the engine's processes, by process title."""
    import psutil

    used: dict[str, float] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            times, name = proc.cpu_times(), proc.name()
        except psutil.NoSuchProcess:
            continue
        used[name] = used.get(name, 0.0) + times.user + times.system
    return used


def spec_counters(llm) -> dict[str, float]:
    return {m.name.removeprefix("vllm:spec_decode_"): m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}


def load_prompts(args, tokenizer) -> list:
    if not args.prompts_file:
        return [f"Question {i}: describe, step by step, how a {w} works."
                for i, w in enumerate(["bicycle", "clock", "compiler", "kettle"] * 8)]
    from dflash_plugin.prompt_io import encode_user_turn, read_prompts_file

    return [{"prompt_token_ids": encode_user_turn(tokenizer, turn)}
            for turn in (r["turns"][0] for r in read_prompts_file(args.prompts_file))]


def main(argv=None) -> int:
    args = parse_args(argv)
    configure_env(args)
    from vllm import LLM, SamplingParams

    from dflash_plugin.target import resolve_target

    target = str(resolve_target(args.target))
    engine_kwargs = dict(model=target, dtype=args.dtype, max_model_len=1024, seed=0,
                         max_num_seqs=32, kv_cache_memory_bytes=1 << 30, disable_log_stats=False,
                         enforce_eager=args.eager)
    if args.executor:
        engine_kwargs["distributed_executor_backend"] = args.executor
    engine_kwargs.update(args.engine_args)
    if args.mode != "none":
        if not args.draft:
            sys.exit("--draft is required for plugin / native")
        engine_kwargs["speculative_config"] = {"method": "dflash", "model": args.draft,
                                               "num_speculative_tokens": args.k,
                                               **args.spec_extra}
    phases = None
    if args.phases:
        if args.executor:
            sys.exit("--phases times the in-process executor; leave --executor out")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import phase_times as phases

        print("timing phases:", ", ".join(phases.install()), flush=True)
    if args.aux_layers:
        if args.mode != "none" or not args.phases:
            sys.exit("--aux-layers is for none with --phases")
        add_aux_outputs(tuple(int(i) for i in args.aux_layers.split(",")))
    began = time.perf_counter()
    llm = LLM(**engine_kwargs)
    startup = time.perf_counter() - began
    prompts = load_prompts(args, llm.get_tokenizer())
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens,
                            ignore_eos=not args.prompts_file)
    llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
    for _ in range(args.repeats):
        for batch in (int(b) for b in args.batches.split(",")):
            before, cpu_before = spec_counters(llm), engine_cpu_seconds()
            phases_before = phases.snapshot() if phases else None
            began = time.perf_counter()
            # Synthetic prompts: one batch. A prompts file: all of it, `batch` at a time.
            groups = ([prompts[i:i + batch] for i in range(0, len(prompts), batch)]
                      if args.prompts_file else [prompts[:batch]])
            outputs = [o for g in groups for o in llm.generate(g, params, use_tqdm=False)]
            wall = time.perf_counter() - began
            cpu_after = engine_cpu_seconds()
            cpu = sum(cpu_after.values()) - sum(cpu_before.values())
            worker_cpu = sum(v - cpu_before.get(k, 0.0) for k, v in cpu_after.items()
                             if "Worker" in k)
            after = spec_counters(llm)
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            row = dict(mode=args.mode, policy=args.policy if args.mode == "plugin" else None,
                       draft=args.draft if args.mode != "none" else None,
                       eager=args.eager, executor=args.executor,
                       prompts_file=args.prompts_file, engine_args=args.engine_args or None,
                       aux_layers=args.aux_layers, k=args.k,
                       spec_extra=args.spec_extra or None, batch=batch,
                       tokens=tokens, wall_s=round(wall, 3),
                       cpu_s=round(cpu, 3), tok_per_s=round(tokens / wall, 2),
                       tok_per_cpu_s=round(tokens / cpu, 2) if cpu else None,
                       worker_cpu_s=round(worker_cpu, 3), startup_s=round(startup, 1),
                       load=round(os.getloadavg()[0], 1),
                       **{k: after.get(k, 0) - before.get(k, 0) for k in after})
            if phases:
                row["phases"] = phases.since(phases_before)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
