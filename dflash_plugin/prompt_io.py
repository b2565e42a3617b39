"""Reading prompt files and formatting prompts for a target (chat template for instruct models)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from dflash_plugin.errors import DFlashError


def json_lines(path: str | Path) -> Iterator[tuple[int, str, object]]:
    """(line number, line, parsed value) of each non-blank line of a JSON-lines file, gzipped
    when the name ends in .gz; a line that is not JSON raises DFlashError naming the file and
    line."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, line, json.loads(line)
            except json.JSONDecodeError as err:
                raise DFlashError(f"{path}:{number}: not JSON ({err})") from err


def read_prompts_file(path: str | Path) -> list[dict]:
    """Lines of {"prompt": str}, {"text": str} (the evaluation sets under train_data/eval) or
    {"turns": [str, ...]}; returns dicts with a "turns" list."""
    records = []
    for number, line, rec in json_lines(path):
        if not isinstance(rec, dict):
            raise DFlashError(f"{path}:{number}: needs a JSON object, got {line.strip()[:40]}")
        if isinstance(rec.get("turns"), list) and rec["turns"]:
            turns = [str(t) for t in rec["turns"]]
        elif isinstance(rec.get("prompt"), str):
            turns = [rec["prompt"]]
        elif isinstance(rec.get("text"), str):
            turns = [rec["text"]]
        else:
            raise DFlashError(f"{path}:{number}: needs a \"prompt\" or \"text\" string or a "
                              "\"turns\" list")
        records.append({**rec, "turns": turns})
    if not records:
        raise DFlashError(f"{path} holds no prompts")
    return records


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Prompt ids for a conversation, ready for the assistant's next answer."""
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"])
    return tokenizer("\n".join(m["content"] for m in messages))["input_ids"]


def encode_user_turn(tokenizer, text: str) -> list[int]:
    """Prompt ids for a single user message (a prompt file's first turn, a benchmark prompt)."""
    return encode_chat(tokenizer, [{"role": "user", "content": text}])


def stop_token_ids(tokenizer, generation_config=None) -> set[int]:
    """EOS ids of the tokenizer and the model's generation config."""
    ids = set()
    for source in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(source)
    return ids
