"""Stage 4 of training: fit the drafter on stored target features.

Random anchors per sequence (uniform, or weighted towards where decoding starts blocks:
`anchor_sampling`), each starting a block; cross-entropy weighted exp(-(k-1)/gamma)
per block position (optionally mixed with a KL term towards the target's whole next-token
distribution, renormalised over the draft vocabulary: `distill_weight`, not in the paper); the
target's embedding and LM head are frozen and shared; AdamW with a
cosine schedule and warm-up, gradient clipping, bf16 autocast on CPUs with native bf16 and float32
where bf16 runs in software (`TrainingPrecision`); deterministic seeds; a checkpoint (published
format + optimizer state) that a re-run resumes from.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.nn import functional as F
from tqdm import tqdm

from dflash_plugin.checkpoint import load_drafter, save_drafter
from dflash_plugin.config import make_config
from dflash_plugin.cpu_features import default_cpu_dtype
from dflash_plugin.draft_vocab import reduced_head, with_reduced_vocabulary
from dflash_plugin.drafter import DFlashDraftModel
from dflash_plugin.layout import default_gamma
from dflash_plugin.lookup_hints import enable_lookup_hints, fill_batch_hints
from dflash_plugin.train.batches import (draft_block_batch, leading_matches, make_block_batch,
                                         sample_anchors)
from dflash_plugin.train.block_starts import (
    block_start_weights,
    first_draft_hits,
    sample_weighted_anchors,
)
from dflash_plugin.train.deepen import deepen_drafter, default_kept_layers, shallower_drafter
from dflash_plugin.train.feature_store import FeatureSource, FeatureStore, OnlineFeatures
from dflash_plugin.train.widen import widen_drafter

STATE_FILE = "train_state.pt"


@dataclass
class TrainConfig:
    store: str
    out_dir: str
    num_draft_layers: int = 3
    block_size: int = 16
    mask_token_id: int = 0
    gamma: float | None = None  # None: the paper's value for the block size
    draft_vocab_size: int | None = None  # None: the target's full vocabulary
    epochs: float = 6.0
    anchors_per_seq: int = 48
    seqs_per_step: int = 4
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 100
    max_steps: int | None = None  # stop early (smoke tests), keeping the schedule of `epochs`
    init_from_target: bool = True  # start from the target's own layers (see init_from_target)
    init_from: str | None = None  # start from this drafter checkpoint instead (new schedule)
    # Share of the loss that matches the target's whole next-token distribution (KL) instead of
    # its greedy token alone (not in the paper; needs online features). 0: the paper's loss.
    distill_weight: float = 0.0
    # "bfloat16" (autocast) or "float32"; None: bf16 unless this CPU is known to lack native bf16.
    compute_dtype: str | None = None
    # Where anchors fall: "uniform" over the answer (the paper), or "block-starts": weighted
    # towards the positions where greedy decoding starts its blocks (train/block_starts.py).
    anchor_sampling: str = "uniform"
    # "cpu" or a CUDA device ("cuda", "cuda:1"); the target given to the trainer must sit there.
    device: str = "cpu"
    # Wall-clock budget: after `CALIBRATION_STEPS` steps the schedule is refitted so that it
    # ends when the budget does (None: the schedule of `epochs`).
    time_budget_s: float | None = None
    # Share of the blocks with a prompt-lookup match that carry the lookup's continuation in
    # their mask slots (lookup_hints.py); 0: masks only (the paper).
    lookup_hints: float = 0.0
    # With `init_from` deeper than `num_draft_layers`: the indices of its layers to keep (None:
    # the first num_draft_layers - 1 and the last; deepen.default_kept_layers).
    keep_layers: list[int] | None = None


ANCHOR_SAMPLINGS = ("uniform", "block-starts")
CALIBRATION_STEPS = 20


class TrainingPrecision:
    """How the drafter computes while training. bf16 autocast where the CPU has bf16 dot
    products (or cannot tell); float32 where bf16 runs in software (AVX2-only x86), where a bf16
    matmul is several times slower than a float32 one (cpu_features). In float32 the bf16 inputs
    (stored features, a bf16 target's embedding and LM head) are cast up, as autocast would cast
    them down."""

    CHOICES = ("bfloat16", "float32")

    def __init__(self, name: str | None = None, device: str = "cpu"):
        self.device_type = torch.device(device).type
        if name is None:  # GPUs have bf16 tensor cores; a CPU may lack native bf16
            name = "bfloat16" if self.device_type != "cpu" else default_cpu_dtype() or "bfloat16"
        if name not in self.CHOICES:
            raise ValueError(f"compute dtype {name!r}: choose from {', '.join(self.CHOICES)}")
        self.name = name
        self.autocast_bf16 = name == "bfloat16"

    def autocast(self):
        return torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.autocast_bf16)

    def inputs(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.autocast_bf16 else tensor.float()

    def frozen(self, module: torch.nn.Module) -> torch.nn.Module:
        """The target's frozen module in the compute dtype (a float32 copy of a bf16 one)."""
        module.requires_grad_(False)
        if self.autocast_bf16 or next(module.parameters()).dtype == torch.float32:
            return module
        return copy.deepcopy(module).float().requires_grad_(False)


def select_draft_vocab(store: FeatureSource, size: int, vocab_size: int) -> torch.Tensor:
    """Sorted ids of the draft vocabulary: the most frequent response tokens, then prompt
    tokens, then the lowest remaining ids. The draft can only ever propose these."""
    responses, prompts = Counter(), Counter()
    for seq in store.sequences:
        responses.update(seq.input_ids[seq.prompt_len:])
        prompts.update(seq.input_ids[:seq.prompt_len])
    ranked = [t for t, _ in responses.most_common()] + [t for t, _ in prompts.most_common()]
    chosen = list(dict.fromkeys(ranked))[:size]
    if len(chosen) < size:
        taken = set(chosen)
        chosen += [i for i in range(vocab_size) if i not in taken][: size - len(chosen)]
    return torch.tensor(sorted(chosen))


def init_drafter(cfg: TrainConfig, target, store: FeatureSource) -> DFlashDraftModel:
    layer_ids = store.meta["target_layer_ids"]
    config = make_config(target.config, num_draft_layers=cfg.num_draft_layers,
                         block_size=cfg.block_size, mask_token_id=cfg.mask_token_id,
                         target_layer_ids=layer_ids, draft_vocab_size=cfg.draft_vocab_size)
    torch.manual_seed(cfg.seed)
    drafter = DFlashDraftModel(config)
    if drafter.lm_head is not None:
        keep = select_draft_vocab(store, cfg.draft_vocab_size, config.vocab_size)
        weight, d2t = reduced_head(target.get_output_embeddings().weight.data, keep)
        drafter.lm_head.weight.data.copy_(weight)
        drafter.d2t.copy_(d2t)
    if cfg.init_from_target:
        init_from_target(drafter, target, layer_ids)
    return drafter


def init_from_target(drafter: DFlashDraftModel, target, layer_ids: list[int]):
    """Warm start (not in the paper, which initialises randomly): copy target decoder layers
    into the draft layers (the first ones, which read token embeddings like the block does, and
    the last, which feeds the shared LM head), the target's final norm, and make `fc` pass the
    deepest captured layer through unchanged, so the context is informative from step one.
    Qwen3's q/k norms have no Llama counterpart and start as identity scales."""
    layers = target.model.layers
    n = len(drafter.layers)
    sources = list(range(n - 1)) + [len(layers) - 1]
    for draft_layer, source in zip(drafter.layers, sources):
        missing, _ = draft_layer.load_state_dict(layers[source].state_dict(), strict=False)
        assert all("q_norm" in k or "k_norm" in k for k in missing), missing
    drafter.norm.weight.data.copy_(target.model.norm.weight.data)
    hidden = target.config.hidden_size
    fc = torch.zeros_like(drafter.fc.weight)
    deepest = layer_ids.index(max(layer_ids))
    fc[:, deepest * hidden:(deepest + 1) * hidden] = torch.eye(hidden)
    drafter.fc.weight.data.copy_(fc + 0.01 * torch.randn_like(fc))


def check_continuation(drafter: DFlashDraftModel, cfg: TrainConfig, store: FeatureSource):
    """A drafter to continue from must match the store's layers and the asked shape."""
    fields = drafter.fields
    wanted = {"target_layer_ids": (list(fields.target_layer_ids), store.meta["target_layer_ids"]),
              "block_size": (fields.block_size, cfg.block_size),
              "mask_token_id": (fields.mask_token_id, cfg.mask_token_id),
              "num_draft_layers": (len(drafter.layers), cfg.num_draft_layers)}
    bad = [f"{name} {have} (wanted {want})" for name, (have, want) in wanted.items()
           if have != want]
    if bad:
        raise ValueError(f"--init-from {cfg.init_from} does not fit this run: " + ", ".join(bad))


@torch.no_grad()
def teacher_log_probs(drafter: DFlashDraftModel, final_hidden: torch.Tensor,
                      block_positions: torch.Tensor, target_head,
                      precision: TrainingPrecision | None = None) -> torch.Tensor:
    """The target's next-token log-probabilities for each block position's token, over the
    draft vocabulary: the token at position p is predicted from the final hidden state at p-1.
    Rows for the bonus position and past the sequence are clamped copies (their weight is 0)."""
    precision = precision or TrainingPrecision("bfloat16")
    previous = (block_positions - 1).clamp(0, final_hidden.shape[0] - 1).to(final_hidden.device)
    with precision.autocast():
        logits = drafter.draft_logits(precision.inputs(final_hidden[previous]), target_head).float()
    return logits.log_softmax(-1)


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    warmup = max(1, int(total * cfg.warmup_ratio))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class Trainer:
    def __init__(self, cfg: TrainConfig, target, features: OnlineFeatures | None = None):
        """`features`: computed by the target as training goes (default: the store cfg.store)."""
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store = features if features is not None else FeatureStore(cfg.store)
        if cfg.anchor_sampling not in ANCHOR_SAMPLINGS:
            raise ValueError(f"anchor sampling {cfg.anchor_sampling!r}: choose from "
                             f"{', '.join(ANCHOR_SAMPLINGS)}")
        if not 0.0 <= cfg.lookup_hints <= 1.0:
            raise ValueError(f"lookup_hints {cfg.lookup_hints} is outside [0, 1]")
        if not 0.0 <= cfg.distill_weight <= 1.0:
            raise ValueError(f"distill_weight {cfg.distill_weight} is outside [0, 1]")
        if cfg.distill_weight and not isinstance(self.store, OnlineFeatures):
            raise ValueError("distillation needs the target's final hidden states, which only "
                             "online features compute (--online-features); the feature store "
                             "keeps the selected layers only")
        if not self.store.sequences:
            source = "the online feature source" if features is not None else cfg.store
            raise ValueError(f"feature source {source} holds no sequences")
        self.device = torch.device(cfg.device)
        if cfg.time_budget_s is not None and cfg.time_budget_s <= 0:
            raise ValueError(f"time budget {cfg.time_budget_s} s: give a positive number")
        self.precision = TrainingPrecision(cfg.compute_dtype, cfg.device)
        self.embed = self.precision.frozen(target.get_input_embeddings()).to(self.device)
        self.target_head = self.precision.frozen(target.get_output_embeddings()).to(self.device)
        self.gamma = cfg.gamma or default_gamma(cfg.block_size)
        self.total_steps = math.ceil(cfg.epochs * len(self.store.sequences) / cfg.seqs_per_step)
        self.step = 0
        ckpt = self.out / "checkpoint"
        if (self.out / STATE_FILE).is_file():
            self.drafter = load_drafter(ckpt, dtype=torch.float32).train()
        elif cfg.init_from:
            self.drafter = load_drafter(cfg.init_from, dtype=torch.float32).train()
            if len(self.drafter.layers) < cfg.num_draft_layers:
                # A shallower drafter to grow: the added layers start as the identity.
                self.drafter = deepen_drafter(self.drafter, cfg.num_draft_layers)
            elif len(self.drafter.layers) > cfg.num_draft_layers:
                # A deeper drafter to shrink: keep some of its trained layers.
                keep = cfg.keep_layers or default_kept_layers(len(self.drafter.layers),
                                                              cfg.num_draft_layers)
                if len(keep) != cfg.num_draft_layers:
                    raise ValueError(f"keep_layers {keep} holds {len(keep)} layers, not "
                                     f"num_draft_layers {cfg.num_draft_layers}")
                self.drafter = shallower_drafter(self.drafter, keep)
            elif cfg.keep_layers:
                raise ValueError(f"keep_layers {cfg.keep_layers}: --init-from {cfg.init_from} has "
                                 f"{len(self.drafter.layers)} layers, not more than "
                                 f"num_draft_layers {cfg.num_draft_layers}")
            if set(self.store.meta["target_layer_ids"]) > set(self.drafter.fields.target_layer_ids):
                # More target layers than it was trained on: the added ones start unread.
                self.drafter = widen_drafter(self.drafter, self.store.meta["target_layer_ids"])
            check_continuation(self.drafter, cfg, self.store)
            if cfg.draft_vocab_size and self.drafter.lm_head is None:
                # An exported (full-vocabulary) drafter: train with the reduced head again.
                keep = select_draft_vocab(self.store, cfg.draft_vocab_size,
                                          self.drafter.config.vocab_size)
                self.drafter = with_reduced_vocabulary(
                    self.drafter, self.target_head.weight.data.float(), keep).train()
        elif cfg.keep_layers:
            raise ValueError("keep_layers picks layers of a deeper --init-from drafter; none given")
        else:
            self.drafter = init_drafter(cfg, target, self.store).float().train()
        if cfg.lookup_hints:
            enable_lookup_hints(self.drafter)
        self.drafter.to(self.device)
        if self.drafter.lm_head is not None:
            self.drafter.lm_head.requires_grad_(False)
        # target ids -> draft ids (-1 outside the draft vocabulary), for the labels
        self.target_to_draft = None
        if self.drafter.d2t is not None:
            draft_ids = torch.arange(self.drafter.d2t.numel(), device=self.device)
            self.target_to_draft = torch.full((self.embed.num_embeddings,), -1, dtype=torch.long,
                                              device=self.device)
            self.target_to_draft[draft_ids + self.drafter.d2t] = draft_ids
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self._epoch_order: tuple[int | None, list[int]] = (None, [])
        if (self.out / STATE_FILE).is_file():
            self._resume()

    def _resume(self):
        state = torch.load(self.out / STATE_FILE, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]
        self.total_steps = state.get("total_steps", self.total_steps)
        self.generator.set_state(state["generator"])

    def save(self):
        save_drafter(self.drafter, self.out / "checkpoint", dtype=torch.float32)
        state = {"optimizer": self.optimizer.state_dict(), "step": self.step,
                 "total_steps": self.total_steps,
                 "generator": self.generator.get_state(), "config": asdict(self.cfg)}
        torch.save(state, self.out / f"{STATE_FILE}.tmp")
        (self.out / f"{STATE_FILE}.tmp").replace(self.out / STATE_FILE)

    def sequence_loss(self, seq) -> tuple[torch.Tensor, dict]:
        ids = torch.tensor(seq.input_ids)  # on the CPU: anchors and block layout are built there
        if self.cfg.distill_weight:
            features, final_hidden = self.store.features_and_final_hidden(seq)
        else:
            features, final_hidden = self.store.features(seq), None
        features = features.to(self.device)
        info = {}
        with self.precision.autocast():
            context = self.drafter.fuse_context(self.precision.inputs(features)[None])
            if self.cfg.anchor_sampling == "block-starts":
                hits = first_draft_hits(self.drafter, self.embed, self.target_head, ids,
                                        context.detach(), seq.prompt_len)
                anchors = sample_weighted_anchors(seq.prompt_len, block_start_weights(hits),
                                                  self.cfg.anchors_per_seq, self.generator)
                info["first_draft_hit"] = float(hits.float().mean())
            else:
                anchors = sample_anchors(seq.prompt_len, seq.length, self.cfg.anchors_per_seq,
                                         self.generator)
            batch = make_block_batch(ids, anchors, self.cfg.block_size, self.cfg.mask_token_id,
                                     self.gamma)
            if self.cfg.lookup_hints:
                batch.block_ids = fill_batch_hints(batch.block_ids, seq.input_ids, anchors,
                                                   self.cfg.block_size, self.cfg.lookup_hints,
                                                   self.generator)
            batch = batch.to(self.device)
            hidden = draft_block_batch(self.drafter, self.embed, batch, context)
            logits = self.drafter.draft_logits(hidden, self.target_head).float()
        labels, weights = batch.labels, batch.weights
        if self.target_to_draft is not None:  # labels outside the draft vocabulary: not learned
            labels = self.target_to_draft[labels]
            weights = weights * (labels >= 0)
            labels = labels.clamp(min=0)
        log_probs = logits.log_softmax(-1)  # shared by the label loss and the KL term
        per_position = F.nll_loss(log_probs, labels, reduction="none")
        if final_hidden is not None:
            teacher = teacher_log_probs(self.drafter, final_hidden, batch.block_positions,
                                        self.target_head, self.precision)
            kl = F.kl_div(log_probs, teacher, log_target=True, reduction="none").sum(-1)
            alpha = self.cfg.distill_weight
            per_position = (1 - alpha) * per_position + alpha * kl
        loss = (per_position * weights).sum() / weights.sum().clamp(min=1e-6)
        correct = (logits.argmax(-1) == labels) & (weights > 0)
        tau = 1 + leading_matches(correct, self.cfg.block_size).float().mean()
        return loss, {"loss": float(loss.detach()), "tau": float(tau), "blocks": batch.num_blocks,
                      **info}

    def _order(self, epoch: int) -> list[int]:
        """The epoch's sequence order (kept: a step asks for it once per sequence)."""
        if self._epoch_order[0] != epoch:
            g = torch.Generator().manual_seed(self.cfg.seed * 1000 + epoch)
            self._epoch_order = (epoch, torch.randperm(len(self.store.sequences),
                                                       generator=g).tolist())
        return self._epoch_order[1]

    def run(self):
        cfg = self.cfg
        n = len(self.store.sequences)
        last = self.total_steps if cfg.max_steps is None else min(cfg.max_steps, self.total_steps)
        log = (self.out / "metrics.jsonl").open("a")
        bar = tqdm(total=last, initial=self.step, desc="train")
        began = time.perf_counter()
        started_at = self.step
        while self.step < last:
            if cfg.time_budget_s is not None and self.step == started_at + CALIBRATION_STEPS:
                last = self._fit_schedule(time.perf_counter() - began, self.step - started_at)
                bar.total = last
            first = self.step * cfg.seqs_per_step
            picks = [self._order(i // n)[i % n] for i in range(first, first + cfg.seqs_per_step)]
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(self.step, self.total_steps, cfg)
            self.optimizer.zero_grad(set_to_none=True)
            metrics = []
            for index in picks:
                loss, info = self.sequence_loss(self.store.sequences[index])
                (loss / len(picks)).backward()
                metrics.append(info)
            torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), cfg.grad_clip)
            self.optimizer.step()
            self.step += 1
            row = {"step": self.step, "lr": self.optimizer.param_groups[0]["lr"],
                   "loss": sum(m["loss"] for m in metrics) / len(metrics),
                   "train_tau": sum(m["tau"] for m in metrics) / len(metrics),
                   "elapsed_s": round(time.perf_counter() - began, 1)}
            if "first_draft_hit" in metrics[0]:  # block-start anchors: the mining pass's rate
                row["first_draft_hit"] = sum(m["first_draft_hit"] for m in metrics) / len(metrics)
            log.write(json.dumps(row) + "\n")
            log.flush()
            bar.set_postfix(loss=f"{row['loss']:.3f}", tau=f"{row['train_tau']:.2f}")
            bar.update(1)
            if self.step % cfg.save_every == 0 or self.step == last:
                self.save()
        bar.close()
        return self.drafter

    def _fit_schedule(self, elapsed: float, steps: int) -> int:
        """Refit the cosine schedule to the time budget from the measured step time, so that
        the learning rate reaches its floor when the budget ends. Returns the last step."""
        rate = elapsed / steps
        self.total_steps = max(self.step + 1,
                               self.step + int((self.cfg.time_budget_s - elapsed) / rate))
        print(f"[dflash] {rate:.3f} s a step on {self.device}: {self.total_steps} steps fit the "
              f"budget of {self.cfg.time_budget_s:.0f} s", flush=True)
        return (self.total_steps if self.cfg.max_steps is None
                else min(self.cfg.max_steps, self.total_steps))
