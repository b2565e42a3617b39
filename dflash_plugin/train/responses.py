"""Stage 2 of training: the target answers every prompt with its own chat template, so the
drafter learns the target's distribution (the published recipe regenerates responses).

Batched through vLLM's offline engine when it is installed (CPU build: hundreds of tokens/s),
else through Hugging Face generation. Resumable: finished prompt ids are skipped on re-run.
A prompt with a `followup` gets a second turn: the follow-up is asked on the target's own
first answer, and that answer is stored as its own record (id PROMPT_ID/followup).

Each record says how its answer ended (`end`): at EOS, at the token cap, or where it started
going round in a loop (`repeats.loop_end`). vLLM answers in segments of tokens and stops an
answer once it loops; most of the tokens a small target writes at T=0 are such loops.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tqdm import tqdm

from dflash_plugin.cpu_features import default_cpu_dtype
from dflash_plugin.prompt_io import encode_chat, encode_user_turn
from dflash_plugin.train.prompts import Prompt
from dflash_plugin.train.repeats import loop_end

FOLLOWUP_SUFFIX = "/followup"
SEGMENT = 128  # new tokens per request before the loop check; a larger one wastes more on loops


def settle(ids: list[int], at_eos: bool, cap: int) -> tuple[list[int], str] | None:
    """(answer, how it ended) once it is over (a loop found, EOS, or the cap), else None."""
    end = loop_end(ids)
    if end is not None:
        return ids[:end], "loop"
    if at_eos:
        return ids, "eos"
    if len(ids) >= cap:
        return ids[:cap], "cap"
    return None


def answer_in_segments(step, prompt_ids: list[list[int]], cap: int,
                       segment: int = SEGMENT) -> list[tuple[list[int], str]]:
    """Answer every prompt, `segment` new tokens per round, continuing the unfinished ones on
    prompt + answer so far, until each loops, ends at EOS or reaches `cap` tokens.

    `step(requests)` takes [(ids, max_new_tokens)] and returns [(new token ids, ended at EOS)].
    At T=0 the continuation of a prefix is the answer an uninterrupted run writes; the engine's
    prefix cache keeps the re-read prefix from being recomputed.
    """
    answers: list[list[int]] = [[] for _ in prompt_ids]
    done: list[tuple[list[int], str] | None] = [None] * len(prompt_ids)
    todo = list(range(len(prompt_ids)))
    while todo:
        replies = step([(prompt_ids[i] + answers[i], min(segment, cap - len(answers[i])))
                        for i in todo])
        still = []
        for i, (new, at_eos) in zip(todo, replies):
            answers[i] += new
            done[i] = settle(answers[i], at_eos, cap)
            if done[i] is None:
                still.append(i)
        todo = still
    return done


def _done_ids(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    with path.open() as f:
        return {json.loads(line)["id"] for line in f if line.strip()}


def offline_llm(target_path: str, dtype: str | None, seed: int, max_model_len: int):
    """vLLM's offline engine for a batch job on this machine's CPUs."""
    # Both cores for one batch job (vLLM's CPU default reserves one core for the front end).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM

    return LLM(model=target_path, dtype=dtype or default_cpu_dtype() or "bfloat16",
               max_model_len=max_model_len, gpu_memory_utilization=0.5, seed=seed)


def _vllm_engine(target_path: str, max_tokens: int, temperature: float, seed: int,
                 dtype: str | None = None, max_model_len: int = 4096):
    """A function prompt ids -> [(answer ids, how it ended)] backed by one vLLM offline
    engine, answering in segments (answer_in_segments)."""
    from vllm import SamplingParams, TokensPrompt

    llm = offline_llm(target_path, dtype, seed, max_model_len)

    def step(requests: list[tuple[list[int], int]]) -> list[tuple[list[int], bool]]:
        # Token ids are all we keep: skipping detokenization frees the front-end process's CPU.
        # A seed per position, so a continued answer does not replay its first segment's draws.
        params = [SamplingParams(temperature=temperature, max_tokens=n, seed=seed + len(ids),
                                 detokenize=False) for ids, n in requests]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids, _ in requests],
                               params, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason == "stop")
                for o in outputs]

    def run(prompt_ids: list[list[int]]) -> list[tuple[list[int], str]]:
        return answer_in_segments(step, prompt_ids, max_tokens)
    return run


def _hf_engine(target_path: str, max_tokens: int, temperature: float, seed: int,
               dtype: str | None = None, max_model_len: int = 4096):
    """The same through Hugging Face decoding (slow; for tests and machines without vLLM)."""
    import torch

    from dflash_plugin.generate import generate_plain
    from dflash_plugin.sampling import SamplingParams
    from dflash_plugin.target import load_target

    model, tokenizer = load_target(target_path)
    stops = {tokenizer.eos_token_id}

    def run(prompt_ids: list[list[int]]) -> list[tuple[list[int], str]]:
        answers = []
        for i, ids in enumerate(prompt_ids):
            out = generate_plain(model, torch.tensor([ids]), max_tokens,
                                 SamplingParams(temperature), seed=seed + i, stop_token_ids=stops)
            answers.append(settle(out.token_ids, bool(out.token_ids)
                                  and out.token_ids[-1] in stops, max_tokens)
                           or (out.token_ids, "cap"))
        return answers
    return run


def generate_responses(target_path: str | Path, prompts: list[Prompt], out_path: str | Path,
                       *, max_tokens: int = 1024, temperature: float = 0.0, seed: int = 0,
                       engine: str = "vllm", chunk: int = 512, dtype: str | None = None,
                       max_model_len: int = 4096) -> dict:
    """Append {id, category, prompt, prompt_ids, response_ids, end} lines to out_path (plus
    source, task and turn when known); returns counts of this call's work."""
    from transformers import AutoTokenizer

    out_path = Path(out_path)
    done = _done_ids(out_path)
    todo = [p for p in prompts if p.id not in done]
    stats = {"prompts": 0, "followups": 0, "followups_too_long": 0, "skipped_too_long": 0,
             "response_tokens": 0}
    if not todo:
        return stats
    tokenizer = AutoTokenizer.from_pretrained(str(target_path))
    run = {"vllm": _vllm_engine, "hf": _hf_engine}[engine](str(target_path), max_tokens,
                                                           temperature, seed + len(done),
                                                           dtype, max_model_len)
    for begin in tqdm(range(0, len(todo), chunk), desc="responses", unit="chunk"):
        batch = todo[begin:begin + chunk]
        encoded = [(p, encode_user_turn(tokenizer, p.text)) for p in batch]
        # A prompt that leaves no room for a whole answer would be refused by the engine.
        fits = [(p, ids) for p, ids in encoded if len(ids) + max_tokens <= max_model_len]
        stats["skipped_too_long"] += len(encoded) - len(fits)
        responses = run([ids for _, ids in fits]) if fits else []
        rows = [_row(p, p.id, p.text, ids, response, 1, end)
                for (p, ids), (response, end) in zip(fits, responses)]
        second = []
        for (p, ids), (response, _) in zip(fits, responses):
            if not p.followup:
                continue
            messages = [{"role": "user", "content": p.text},
                        {"role": "assistant",
                         "content": tokenizer.decode(response, skip_special_tokens=True)},
                        {"role": "user", "content": p.followup}]
            conv = encode_chat(tokenizer, messages)
            if len(conv) + max_tokens <= max_model_len:
                second.append((p, conv))
            else:
                stats["followups_too_long"] += 1
        if second:
            for (p, conv), (response, end) in zip(second, run([c for _, c in second])):
                rows.append(_row(p, p.id + FOLLOWUP_SUFFIX, p.followup, conv, response, 2, end))
        stats["prompts"] += len(fits)
        stats["followups"] += len(second)
        stats["response_tokens"] += sum(len(r["response_ids"]) for r in rows)
        # One write per chunk: a stop between turns never leaves a prompt half answered.
        with out_path.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    return stats


def _row(p: Prompt, row_id: str, text: str, prompt_ids: list[int], response: list[int],
         turn: int, end: str) -> dict:
    row = {"id": row_id, "category": p.category, "prompt": text, "prompt_ids": prompt_ids,
           "response_ids": response, "end": end}
    if p.source:
        row.update(source=p.source, task=p.task, turn=turn)
    return row
