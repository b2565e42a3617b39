"""Does a drafter fit a target? The same rules as `features.check_pair`, stated on plain config
numbers so that an engine adapter can refuse a mismatched pair at start-up, before any weight
is loaded or any target layer is hooked, and `dflash serve` before it launches an engine."""

from __future__ import annotations

from dataclasses import dataclass

from dflash_plugin.errors import MismatchError


@dataclass(frozen=True)
class TargetShape:
    num_layers: int
    hidden_size: int
    vocab_size: int


@dataclass(frozen=True)
class DrafterShape:
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    hidden_size: int
    vocab_size: int
    target_hidden_size: int  # the feature width the drafter's `fc` was trained on
    num_target_layers: int | None  # what the drafter declares it was trained for, if anything


def check_pair_shapes(target: TargetShape, drafter: DrafterShape):
    """Refuse a drafter that does not fit the target, naming the mismatch."""
    if drafter.num_target_layers is not None and drafter.num_target_layers != target.num_layers:
        raise MismatchError(f"drafter was trained for a target with {drafter.num_target_layers} "
                            f"layers, the target has {target.num_layers}")
    bad_ids = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_layers]
    if bad_ids:
        raise MismatchError(f"drafter target_layer_ids {list(drafter.target_layer_ids)} include "
                            f"{bad_ids}, but the target has only {target.num_layers} layers "
                            f"(0..{target.num_layers - 1})")
    if drafter.target_hidden_size != target.hidden_size:
        raise MismatchError(f"drafter expects target hidden size {drafter.target_hidden_size}, "
                            f"the target has {target.hidden_size}")
    if drafter.hidden_size != target.hidden_size:
        raise MismatchError(f"drafter hidden size {drafter.hidden_size} differs from the target's "
                            f"{target.hidden_size}: it borrows the target's embeddings and LM head")
    if drafter.vocab_size != target.vocab_size:
        raise MismatchError(f"drafter vocab size {drafter.vocab_size} differs from the target's "
                            f"{target.vocab_size}")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise MismatchError(f"mask_token_id {drafter.mask_token_id} is outside the target's "
                            f"vocabulary of {target.vocab_size}")


def drafter_shape(config: dict) -> DrafterShape:
    """A DFlash drafter's shape from its config.json (or an HF config's to_dict()): the layer
    ids in `dflash_config` (the published format), the mask token there or at the top level."""
    extra = config.get("dflash_config") or {}
    mask_token_id = extra.get("mask_token_id", config.get("mask_token_id"))
    return DrafterShape(
        # Without ids the engine picks its own default layers, which always exist.
        target_layer_ids=tuple(int(i) for i in extra.get("target_layer_ids", ())),
        mask_token_id=-1 if mask_token_id is None else int(mask_token_id),
        hidden_size=int(config["hidden_size"]),
        vocab_size=int(config["vocab_size"]),
        target_hidden_size=int(config.get("target_hidden_size") or extra.get("target_hidden_size")
                               or config["hidden_size"]),
        num_target_layers=config.get("num_target_layers"),
    )


def target_shape(config: dict) -> TargetShape | None:
    """A decoder-only target's shape from its config.json (the text model's, for multimodal
    configs); None when the usual fields are not there (the engine then checks at start-up)."""
    text = config.get("text_config") or config
    try:
        return TargetShape(num_layers=int(text["num_hidden_layers"]),
                           hidden_size=int(text["hidden_size"]),
                           vocab_size=int(text["vocab_size"]))
    except (KeyError, TypeError, ValueError):
        return None
