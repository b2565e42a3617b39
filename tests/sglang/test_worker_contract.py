"""This project's drafter provides everything SGLang's DFLASH worker uses of a draft model, as
read from the installed worker's source (worker_contract.py), with the signatures of SGLang's
own DFlashDraftModel; what it does not provide is only used on paths it switches off."""

from __future__ import annotations

import inspect
import re

import pytest

pytest.importorskip("sglang.srt", reason="run under .venv-sglang (scripts/setup_sglang_env.sh)")

from sglang.srt.layers.radix_attention import AttentionType, RadixAttention  # noqa: E402
from sglang.srt.models import dflash as sglang_dflash  # noqa: E402
from sglang.srt.speculative import dflash_worker_v2, draft_parallel  # noqa: E402

from sglang_ext.draft_model import DFlashDraftModel  # noqa: E402
from worker_contract import (ATTENTION, LAYER, MODEL, RADIX, accepts,  # noqa: E402
                             signature_shape, worker_uses)

USES = worker_uses(dflash_worker_v2)

# Used by the worker only on paths this drafter switches off; test_gates_hold checks each switch.
GATED = {
    (MODEL, "compute_candidates"): "DFlash2 selector: only when candidate_selector is not None",
    (MODEL, "prefix_gru"): "Domino rollout: only for projector_type 'domino' (refused)",
    (MODEL, "embed_proj"): "Domino rollout: idem",
    (ATTENTION, "qkv_proj"): "fused Triton KV writer: only when supports_fused_context_kv",
    (ATTENTION, "rotary_emb"): "fused Triton KV writer: idem",
    (ATTENTION, "forward_prepare_npu"): "Ascend NPU path (refused)",
    (ATTENTION, "v_scale"): "Ascend NPU path: idem",
}
# Called by SGLang's model runner and loader rather than by the worker.
RUNNER_METHODS = ("forward", "load_weights")
REFERENCE = {MODEL: sglang_dflash.DFlashDraftModel, ATTENTION: sglang_dflash.DFlashAttention}


def objects(model):
    attention = model.layers[0].self_attn
    return {MODEL: model, LAYER: model.layers[0], ATTENTION: attention, RADIX: attention.attn}


def test_the_scan_finds_the_worker_calls():
    """Guards the scanner itself: these are the core of DFlash KV injection and drafting."""
    assert {"project_target_hidden", "set_block_size", "layers"} <= USES.names(MODEL)
    assert {"kv_proj_only", "apply_k_norm", "apply_k_rope", "attn"} <= USES.names(ATTENTION)
    assert "self_attn" in USES.names(LAYER)
    assert "k_scale" in USES.names(RADIX)


def test_every_attribute_the_worker_reads_is_provided(sglang_drafter):
    found = objects(sglang_drafter)
    missing = [f"{kind}.{name} (worker lines {lines[:3]})"
               for kind, names in USES.attributes.items() for name, lines in names.items()
               if not hasattr(found[kind], name) and (kind, name) not in GATED]
    assert not missing, "the DFLASH worker uses what our drafter lacks: " + ", ".join(missing)
    optional_missing = [f"{kind}.{name}" for kind, names in USES.optional.items()
                        for name in names if not hasattr(found[kind], name)
                        and (kind, name) not in GATED]
    assert not optional_missing, ("the worker probes these with getattr/hasattr and would fall "
                                  "back to a default: " + ", ".join(optional_missing))


def test_gates_hold(sglang_drafter):
    model = sglang_drafter
    assert model.candidate_selector is None and model.lilicorr is None
    assert not model.draft_config.is_domino
    assert model.supports_fused_context_kv is False
    assert not dflash_worker_v2._is_npu
    stale = [key for key in GATED if key[1] not in USES.names(key[0])]
    assert not stale, f"no longer used by the worker, drop from GATED: {stale}"


def test_worker_calls_fit_our_signatures(sglang_drafter):
    found = objects(sglang_drafter)
    misfits = [f"{kind}.{name}({call.positional} positional, keywords {call.keywords}) at "
               f"line {call.line}"
               for kind, names in USES.calls.items() for name, calls in names.items()
               if (kind, name) not in GATED for call in calls
               if not accepts(getattr(found[kind], name), call)]
    assert not misfits, "worker calls our methods cannot take: " + "; ".join(misfits)


@pytest.mark.parametrize("kind", [MODEL, ATTENTION])
def test_signatures_match_sglang_own_drafter(sglang_drafter, kind):
    ours = objects(sglang_drafter)[kind]
    names = {n for n, _ in USES.calls[kind].items() if (kind, n) not in GATED}
    if kind == MODEL:
        names |= set(RUNNER_METHODS)
    compared = 0
    for name in sorted(names):
        reference = getattr(REFERENCE[kind], name, None)
        if not callable(reference):
            continue
        assert signature_shape(getattr(type(ours), name)) == signature_shape(reference), name
        compared += 1
    assert compared >= 3


def test_shapes_and_types_the_worker_relies_on(sglang_drafter, tiny):
    model = sglang_drafter
    assert len(model.layers) == model.config.num_hidden_layers
    for layer in model.layers:
        attention = layer.self_attn
        assert isinstance(attention.attn, RadixAttention)
        assert attention.attn.attn_type == AttentionType.ENCODER_ONLY  # non-causal block
        assert attention.attn.k_scale is None and attention.attn.v_scale is None
        assert (attention.num_kv_heads, attention.head_dim) == (
            model.config.num_key_value_heads, model.config.head_dim)
    assert isinstance(model.block_size, int)
    assert model.get_input_embeddings() is None  # the worker embeds with the target's table
    assert model.lm_head is None  # the worker applies the target's LM head


def test_class_attributes_read_at_model_resolution():
    """`draft_parallel.model_draft_parallel_spec` reads declarations off the resolved class."""
    source = inspect.getsource(draft_parallel)
    names = set(re.findall(r'getattr\(model_cls, "(\w+)"', source))
    assert names, "SGLang no longer reads class declarations here: re-check draft_parallel.py"
    for name in names:
        assert isinstance(getattr(DFlashDraftModel, name, None),
                          type(getattr(sglang_dflash.DFlashDraftModel, name))), name


def test_checkpoint_fields_read_by_sglang_agree_with_the_core(sglang_drafter):
    """The worker takes mask token, block size and target layers from SGLang's own parse of the
    config; they must be what the core reads from it."""
    sglang_view, core_view = sglang_drafter.draft_config, sglang_drafter.fields
    assert sglang_view.mask_token_id == core_view.mask_token_id
    assert sglang_view.block_size == core_view.block_size
    assert list(sglang_view.target_layer_ids) == list(core_view.target_layer_ids)
    assert sglang_view.num_target_layers == core_view.num_target_layers


@pytest.mark.parametrize("change, named", [
    (lambda c: setattr(c, "layer_types", ["sliding_attention"] * c.num_hidden_layers),
     "sliding-window layers"),
    (lambda c: c.dflash_config.update(conv_kernel_size=3, conv_group_size=4), "conv_kernel_size"),
    (lambda c: c.dflash_config.update(projector_type="domino"), "projector_type"),
    (lambda c: setattr(c, "draft_vocab_size", 32), "reduced draft vocabulary"),
    (lambda c: setattr(c, "is_causal", True), "causal draft attention"),
])
def test_unsupported_checkpoints_are_refused_by_name(tiny, change, named):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny.drafter_dir)
    change(config)
    with pytest.raises(ValueError, match=named) as err:
        DFlashDraftModel(config)
    assert "DFLASH_SGLANG_DRAFTER unset" in str(err.value)


def test_quantized_launch_is_refused(tiny):
    from transformers import AutoConfig

    with pytest.raises(ValueError, match="quantization"):
        DFlashDraftModel(AutoConfig.from_pretrained(tiny.drafter_dir), quant_config=object())
