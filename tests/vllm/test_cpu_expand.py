"""P7 (vllm_ext.cpu_expand): vLLM-CPU's expand of per-request sampling values, probed and fixed."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = pytest.mark.vllm


def test_torch_expansion_repeats_each_value_over_its_positions():
    from vllm_ext.cpu_expand import expand_in_torch

    x = torch.tensor([0.0, 0.5, 0.0, 2.0])
    cu = torch.tensor([1, 1, 4, 6], dtype=torch.int32)  # the second request verifies nothing
    assert expand_in_torch(x, cu, 6, replace_from=0, replace_to=1).tolist() == \
        [1.0, 1.0, 1.0, 1.0, 2.0, 2.0]
    top_k = torch.tensor([0, 7, 49152], dtype=torch.int32)
    got = expand_in_torch(top_k, torch.tensor([2, 3, 5]), 5)
    assert got.dtype == torch.int32 and got.tolist() == [0, 0, 7, 49152, 49152]


def test_the_probe_finds_the_installed_fallback_wrong_and_the_fix_right(monkeypatch):
    """The CPU build's own function (through its C++ fallback) fails the probe; after P7 the
    function vLLM's rejection sampler calls passes it."""
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    from vllm_ext.cpu_expand import expand_is_wrong, install_cpu_expand_fix
    from vllm_ext.guards import PATCH_MARKER

    current_platform.register_triton_kernel_overrides()  # what the worker does at start-up
    original = rejection_sampler.expand_batch_to_tokens
    # An earlier test in this process may have installed P7 already: probe vLLM's own function.
    original = getattr(original, PATCH_MARKER, original)
    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", original)  # undone after
    assert expand_is_wrong(original), "vLLM-CPU's expand works now: P7 can go"
    assert install_cpu_expand_fix() and install_cpu_expand_fix()
    fixed = rejection_sampler.expand_batch_to_tokens
    assert getattr(fixed, PATCH_MARKER) is original and not expand_is_wrong(fixed)


def test_nothing_is_patched_where_the_function_is_right(monkeypatch):
    from vllm.v1.sample import rejection_sampler

    from vllm_ext.cpu_expand import expand_in_torch, install_cpu_expand_fix

    def right(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        return expand_in_torch(x, cu_num_tokens, num_tokens, replace_from, replace_to)

    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", right)
    assert not install_cpu_expand_fix()
    assert rejection_sampler.expand_batch_to_tokens is right
