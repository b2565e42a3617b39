"""Stage 2 of training: the target answers every prompt with its own chat template, so the
drafter learns the target's distribution (the published recipe regenerates responses).

Batched through vLLM's offline engine when it is installed (CPU build: hundreds of tokens/s),
else through Hugging Face generation. Resumable: finished prompt ids are skipped on re-run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tqdm import tqdm

from dflash_plugin.cpu_features import default_cpu_dtype
from dflash_plugin.prompt_io import encode_user_turn
from dflash_plugin.train.prompts import Prompt


def _done_ids(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    with path.open() as f:
        return {json.loads(line)["id"] for line in f if line.strip()}


def _vllm_engine(target_path: str, max_tokens: int, temperature: float, seed: int):
    """A function prompt ids -> response ids backed by one vLLM offline engine."""
    # Both cores for one batch job (vLLM's CPU default reserves one core for the front end).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=target_path, dtype=default_cpu_dtype() or "bfloat16", max_model_len=2048,
              gpu_memory_utilization=0.5, seed=seed)
    # Token ids are all we keep: skipping detokenization frees the front-end process's CPU.
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                            detokenize=False)

    def run(prompt_ids: list[list[int]]) -> list[list[int]]:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params,
                               use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]
    return run


def _hf_engine(target_path: str, max_tokens: int, temperature: float, seed: int):
    """The same through Hugging Face decoding (slow; for tests and machines without vLLM)."""
    import torch

    from dflash_plugin.generate import generate_plain
    from dflash_plugin.sampling import SamplingParams
    from dflash_plugin.target import load_target

    model, tokenizer = load_target(target_path)
    stops = {tokenizer.eos_token_id}

    def run(prompt_ids: list[list[int]]) -> list[list[int]]:
        return [generate_plain(model, torch.tensor([ids]), max_tokens, SamplingParams(temperature),
                               seed=seed + i, stop_token_ids=stops).token_ids
                for i, ids in enumerate(prompt_ids)]
    return run


def generate_responses(target_path: str | Path, prompts: list[Prompt], out_path: str | Path,
                       *, max_tokens: int = 384, temperature: float = 0.0, seed: int = 0,
                       engine: str = "vllm", chunk: int = 512):
    """Append {id, category, prompt, prompt_ids, response_ids} lines to out_path."""
    from transformers import AutoTokenizer

    out_path = Path(out_path)
    done = _done_ids(out_path)
    todo = [p for p in prompts if p.id not in done]
    if not todo:
        return
    tokenizer = AutoTokenizer.from_pretrained(str(target_path))
    run = {"vllm": _vllm_engine, "hf": _hf_engine}[engine](str(target_path), max_tokens,
                                                           temperature, seed + len(done))
    for begin in tqdm(range(0, len(todo), chunk), desc="responses", unit="chunk"):
        batch = todo[begin:begin + chunk]
        prompt_ids = [encode_user_turn(tokenizer, p.text)
                      for p in batch]
        responses = run(prompt_ids)
        with out_path.open("a") as f:
            for p, ids, response in zip(batch, prompt_ids, responses):
                f.write(json.dumps({"id": p.id, "category": p.category, "prompt": p.text,
                                    "prompt_ids": ids, "response_ids": response}) + "\n")
