"""Stage 5 of training: acceptance length tau per category on the held-out prompts, at T=0 and
T=1, with the lossless check (greedy speculative output == plain output) on the same prompts."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from dflash_plugin.generate import SpecDecoder, generate_plain
from dflash_plugin.prompt_io import encode_user_turn, stop_token_ids
from dflash_plugin.sampling import SamplingParams
from dflash_plugin.train.prompts import Prompt


def evaluate_drafter(target, tokenizer, drafter, prompts: list[Prompt], *, max_new_tokens: int = 128,
                     temperatures=(0.0, 1.0), seed: int = 0, check_lossless: bool = True) -> dict:
    """Per-category and overall tau (mean over prompts of the per-step mean), tokens/s ratios,
    and each prompt's tau (with, at T=0, whether its output equals plain decoding's)."""
    decoder = SpecDecoder(target, drafter)
    stops = stop_token_ids(tokenizer, getattr(target, "generation_config", None))
    report: dict = {"max_new_tokens": max_new_tokens, "num_prompts": len(prompts)}
    for temperature in temperatures:
        sampling = SamplingParams(temperature=temperature)
        taus, spec_time, plain_time, tokens, plain_tokens = defaultdict(list), 0.0, 0.0, 0, 0
        identical, per_prompt = 0, []
        for i, prompt in enumerate(tqdm(prompts, desc=f"eval T={temperature}")):
            ids = torch.tensor([encode_user_turn(tokenizer, prompt.text)])
            spec = decoder.generate(ids, max_new_tokens, sampling, seed + i, stops)
            taus[prompt.category].append(spec.stats.mean_accept_length)
            per_prompt.append({"category": prompt.category,
                               "tau": round(spec.stats.mean_accept_length, 3),
                               "new_tokens": len(spec.token_ids)})
            spec_time, tokens = spec_time + spec.wall_s, tokens + len(spec.token_ids)
            if check_lossless or temperature == 0.0:
                plain = generate_plain(target, ids, max_new_tokens, sampling, seed + i, stops)
                plain_time, plain_tokens = plain_time + plain.wall_s, plain_tokens + len(plain.token_ids)
                same = plain.token_ids == spec.token_ids
                identical += same
                if temperature == 0.0:
                    per_prompt[-1]["identical"] = same
        per_category = {c: round(sum(v) / len(v), 3) for c, v in sorted(taus.items())}
        all_taus = [t for v in taus.values() for t in v]
        row = {"tau": round(sum(all_taus) / len(all_taus), 3), "tau_per_category": per_category,
               "spec_tokens_per_s": round(tokens / spec_time, 2)}
        if plain_time:
            row["plain_tokens_per_s"] = round(plain_tokens / plain_time, 2)
            row["speedup"] = round(row["spec_tokens_per_s"] / row["plain_tokens_per_s"], 3)
            if temperature == 0.0:
                row["identical_to_plain"] = f"{identical}/{len(prompts)}"
        row["per_prompt"] = per_prompt
        report[f"T={temperature}"] = row
    return report


def write_report(report: dict, path: str | Path):
    Path(path).write_text(json.dumps(report, indent=1) + "\n")
