"""Stage 3 of training: one target pass per sequence that stores the selected layers' outputs
on disk, so training epochs never re-run the target.

Layout of a store folder:
  meta.json      target, layer ids, feature width, dtype
  index.jsonl    one line per sequence: id, category, offset (rows), length, prompt_len, input_ids
  features.bin   bf16 rows [total_tokens, n_feat*H], appended sequence after sequence
Resumable: index lines are written after their rows, and a re-run truncates the rows file to the
last indexed sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dflash_plugin.features import FeatureCapture

META, INDEX, ROWS = "meta.json", "index.jsonl", "features.bin"


@dataclass(frozen=True)
class StoredSequence:
    id: str
    category: str
    offset: int
    length: int
    prompt_len: int
    input_ids: list[int]


def read_index(store: Path) -> list[StoredSequence]:
    path = Path(store) / INDEX
    if not path.is_file():
        return []
    with path.open() as f:
        return [StoredSequence(**json.loads(line)) for line in f if line.strip()]


class FeatureStore:
    """Read access: features of one sequence as a bf16 tensor view of the memory map."""

    def __init__(self, store: str | Path):
        self.path = Path(store)
        self.meta = json.loads((self.path / META).read_text())
        self.sequences = read_index(self.path)
        width = self.meta["feature_dim"]
        self._rows = np.memmap(self.path / ROWS, dtype=np.uint16, mode="r").reshape(-1, width)

    def features(self, seq: StoredSequence) -> torch.Tensor:
        rows = np.asarray(self._rows[seq.offset: seq.offset + seq.length])
        return torch.from_numpy(rows.copy()).view(torch.bfloat16)


@torch.inference_mode()
def build_feature_store(target, responses_file: str | Path, store: str | Path,
                        layer_ids: list[int], *, max_len: int = 1024, target_name: str = ""):
    """Run the target over prompt+response of every response line and append its features."""
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    width = len(layer_ids) * target.config.hidden_size
    meta = {"target": target_name, "target_layer_ids": list(layer_ids), "feature_dim": width,
            "dtype": "bfloat16", "max_len": max_len}
    if (store / META).is_file():
        old = json.loads((store / META).read_text())
        if old["target_layer_ids"] != meta["target_layer_ids"]:
            raise ValueError(f"{store} holds layers {old['target_layer_ids']}, not {layer_ids}")
    (store / META).write_text(json.dumps(meta, indent=1))
    done = read_index(store)
    offset = done[-1].offset + done[-1].length if done else 0
    with (store / ROWS).open("ab") as rows:
        rows.truncate(offset * width * 2)  # drop rows of a sequence whose index line is missing
    done_ids = {s.id for s in done}
    with open(responses_file) as f:
        records = [json.loads(line) for line in f if line.strip()]
    capture = FeatureCapture(target, layer_ids)
    with capture.active(), (store / ROWS).open("ab") as rows, (store / INDEX).open("a") as index:
        for rec in tqdm([r for r in records if r["id"] not in done_ids], desc="features"):
            ids = (rec["prompt_ids"] + rec["response_ids"])[:max_len]
            if len(ids) <= len(rec["prompt_ids"]) + 1:
                continue  # nothing to learn from: no response inside the length limit
            target.model(torch.tensor([ids]), use_cache=False)  # the LM head is not needed
            feats = capture.take()[0].to(torch.bfloat16)
            rows.write(feats.view(torch.uint16).numpy().tobytes())
            rows.flush()
            index.write(json.dumps({"id": rec["id"], "category": rec["category"],
                                    "offset": offset, "length": len(ids),
                                    "prompt_len": len(rec["prompt_ids"]), "input_ids": ids}) + "\n")
            index.flush()
            offset += len(ids)
