"""Stage 3 of training: one target pass per sequence that stores the selected layers' outputs
on disk, so training epochs never re-run the target. `OnlineFeatures` offers the same reading
interface without the disk: the target runs when training reaches a sequence (worth it for a
round of about one epoch, or a target whose features would not fit on disk).

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
from dflash_plugin.train.repeats import trim_loop

META, INDEX, ROWS = "meta.json", "index.jsonl", "features.bin"


@dataclass(frozen=True)
class StoredSequence:
    id: str
    category: str
    offset: int
    length: int
    prompt_len: int
    input_ids: list[int]


class _EnoughLayers(Exception):
    """Raised by a hook once the deepest captured layer has run: the rest is not needed."""


def target_features(target, capture: FeatureCapture, ids: list[int],
                    dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Features [len(ids), n_feat*H] of one sequence (bf16, as stored), running the target's
    decoder only up to its deepest captured layer (the layers after it, the norm and the LM
    head are skipped)."""
    def stop(*_):
        raise _EnoughLayers

    deepest = capture.layers[max(capture.layer_ids)]
    handle = deepest.register_forward_hook(stop)  # registered after capture's own hook
    try:
        target.model(torch.tensor([ids], device=target.device), use_cache=False)
    except _EnoughLayers:
        pass
    finally:
        handle.remove()
    return capture.take()[0].to(dtype)


def _trainable(record: dict, max_len: int) -> list[int] | None:
    """Prompt + response ids cut to max_len, the response cut where it starts going round in a
    loop (answers saved before answering stopped at loops run on to the cap), or None when no
    response token is left to learn."""
    ids = (record["prompt_ids"] + trim_loop(record["response_ids"]))[:max_len]
    return ids if len(ids) > len(record["prompt_ids"]) + 1 else None


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


class OnlineFeatures:
    """FeatureStore's interface (meta, sequences, features) over a responses file, computing
    each sequence's features with the target when asked: one target pass per sequence visit."""

    def __init__(self, target, responses_file: str | Path, layer_ids: list[int], *,
                 max_len: int = 1024, target_name: str = ""):
        self.meta = {"target": target_name, "target_layer_ids": list(layer_ids),
                     "feature_dim": len(layer_ids) * target.config.hidden_size,
                     "dtype": "bfloat16", "max_len": max_len, "online": True}
        self.sequences = []
        with open(responses_file) as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                ids = _trainable(rec, max_len)
                if ids is not None:
                    self.sequences.append(StoredSequence(rec["id"], rec["category"], 0, len(ids),
                                                         len(rec["prompt_ids"]), ids))
        self._target = target
        self._capture = FeatureCapture(target, layer_ids)

    def features(self, seq: StoredSequence) -> torch.Tensor:
        # no_grad, not inference_mode: the features enter the drafter's autograd graph.
        with torch.no_grad(), self._capture.active():
            return target_features(self._target, self._capture, seq.input_ids)

    def features_and_final_hidden(self, seq: StoredSequence) -> tuple[torch.Tensor, torch.Tensor]:
        """The features, and the target's final (normed) hidden states [len, H] of the same
        pass, from which its next-token distributions follow (distillation)."""
        with torch.no_grad(), self._capture.active():
            final = self._target.model(torch.tensor([seq.input_ids], device=self._target.device),
                                       use_cache=False)
            return (self._capture.take()[0].to(torch.bfloat16),
                    final.last_hidden_state[0].to(torch.bfloat16))


FeatureSource = FeatureStore | OnlineFeatures  # what the trainer reads


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
            ids = _trainable(rec, max_len)
            if ids is None:
                continue
            feats = target_features(target, capture, ids)
            rows.write(feats.cpu().view(torch.uint16).numpy().tobytes())
            rows.flush()
            index.write(json.dumps({"id": rec["id"], "category": rec["category"],
                                    "offset": offset, "length": len(ids),
                                    "prompt_len": len(rec["prompt_ids"]), "input_ids": ids}) + "\n")
            index.flush()
            offset += len(ids)
