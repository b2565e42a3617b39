"""P4/P5 (vllm_ext.plain_sampling) without an engine: which engines serve min_p / logit_bias
requests without drafts, the batch rows it tracks, and the front-end validation it lifts.
tests/server/test_serve_plain_requests.py serves such requests against a plain server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = pytest.mark.vllm


def engine_config(target_path, drafter=None, method="dflash", **extra):
    from vllm.engine.arg_utils import EngineArgs

    spec = None
    if drafter is not None or method == "ngram":
        spec = {"method": method, "num_speculative_tokens": 3}
        if method == "ngram":
            spec |= {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
        else:
            spec["model"] = str(drafter)
    return EngineArgs(model=str(target_path), speculative_config=spec, max_model_len=512,
                      **extra).create_engine_config()


@pytest.fixture
def registered(monkeypatch):
    from vllm_ext import plugin

    monkeypatch.setattr(plugin, "_registered", True)


def test_guards_pass_on_the_installed_vllm():
    from vllm_ext.plain_sampling import guard_problems

    assert guard_problems() == []


def test_needs_plain_sampling():
    from vllm import SamplingParams

    from vllm_ext.plain_sampling import needs_plain_sampling

    assert not needs_plain_sampling(SamplingParams(temperature=0.0))
    assert not needs_plain_sampling(SamplingParams(min_p=1e-6))
    assert needs_plain_sampling(SamplingParams(min_p=0.05))
    assert needs_plain_sampling(SamplingParams(logit_bias={5: -3.0}))


def test_only_this_plugins_synchronous_dflash_serves_them(target_path, random_drafter,
                                                          registered, monkeypatch):
    from vllm_ext import plugin
    from vllm_ext.plain_sampling import serves_plain_requests

    config = engine_config(target_path, random_drafter)
    assert not config.scheduler_config.async_scheduling  # the CPU platform
    assert serves_plain_requests(config)
    monkeypatch.setattr(config.scheduler_config, "async_scheduling", True)
    assert not serves_plain_requests(config)  # P1 hands out full blocks there
    monkeypatch.setattr(config.scheduler_config, "async_scheduling", False)
    monkeypatch.setattr(plugin, "_registered", False)  # the plugin excluded: vLLM's drafter
    assert not serves_plain_requests(config)
    monkeypatch.setattr(plugin, "_registered", True)
    assert not serves_plain_requests(engine_config(target_path, method="ngram"))
    assert not serves_plain_requests(engine_config(target_path))


def test_rows_follow_the_batch_updates():
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor.interface import BatchUpdate, MoveDirectionality

    from vllm_ext.plain_sampling import PlainSamplingRows, plain_rows

    rows = PlainSamplingRows(None, "cpu", False)
    plain, biased, other = (SamplingParams(min_p=0.1), SamplingParams(logit_bias={1: 2.0}),
                            SamplingParams())
    rows.update_state(BatchUpdate(batch_size=4, removed=[], moved=[], added=[
        (0, plain, [1], []), (1, other, [1], []), (2, biased, [1], []), (3, other, [1], [])]))
    assert rows.plain_rows() == [0, 2]
    rows.update_state(BatchUpdate(batch_size=3, removed=[0], added=[], moved=[
        (3, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert rows.plain_rows() == [2]
    rows.update_state(BatchUpdate(batch_size=3, removed=[], added=[], moved=[
        (2, 1, MoveDirectionality.SWAP)]))
    assert rows.plain_rows() == [1]
    rows.update_state(BatchUpdate(batch_size=3, removed=[], moved=[],
                                  added=[(1, other, [1], [])]))  # a new request in that row
    assert rows.plain_rows() == []
    rows.update_state(None)
    assert rows.plain_rows() == []
    metadata = SimpleNamespace(logitsprocs=SimpleNamespace(argmax_invariant=[rows]))
    rows.update_state(BatchUpdate(batch_size=3, removed=[], moved=[],
                                  added=[(2, plain, [1], [])]))
    assert plain_rows(metadata) == [2]
    assert plain_rows(SimpleNamespace(logitsprocs=SimpleNamespace(argmax_invariant=[]))) == []


def test_validation_runs_without_them_and_puts_them_back(target_path, random_drafter,
                                                         registered):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from vllm_ext.plain_sampling import _lifted_validation

    config = engine_config(target_path, random_drafter)
    seen = []

    def original(self, params, supported_tasks):
        seen.append((params.min_p, params.logit_bias))
        params._validate_spec_decode(self.vllm_config.speculative_config)  # what refuses them
        return "validated"

    validate = _lifted_validation(original)
    processor = SimpleNamespace(vllm_config=config, model_config=config.model_config)
    params = SamplingParams(min_p=0.2, logit_bias={7: 1.5})
    assert validate(processor, params, ("generate",)) == "validated"
    assert seen == [(0.0, None)] and (params.min_p, params.logit_bias) == (0.2, {7: 1.5})
    with pytest.raises(VLLMValidationError, match="out-of-vocab"):
        validate(processor, SamplingParams(logit_bias={10 ** 6: 1.0}), ("generate",))
    # An engine without this plugin's drafter keeps vLLM's refusal.
    ngram = engine_config(target_path, method="ngram")
    with pytest.raises((ValueError, VLLMValidationError),
                       match="not yet supported with speculative decoding"):
        validate(SimpleNamespace(vllm_config=ngram, model_config=ngram.model_config),
                 SamplingParams(min_p=0.2), ("generate",))
