"""The executor that returns draft token ids with the sampled tokens (vllm_ext/executor.py):
which RPCs it sends, and what it answers, against a recorded worker; no engine. The engines in
test_engine.py run it for real (lossless output through it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build")

from vllm_ext import executor as ex  # noqa: E402


class RecordingExecutor(ex.DraftIdsWithOutputExecutor):
    """The executor with its worker replaced by a record of the RPCs it is sent."""

    def __init__(self, drafts):
        self.calls = []
        self.drafts = drafts  # what the worker's take_draft_token_ids answers
        self.output_rank = 0
        self.kv_output_aggregator = None
        self.ec_output_aggregator = None
        self.bundles_drafts = True
        self._bundled_drafts = ex._NOTHING

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False,
                       unique_reply_rank=None, kv_output_aggregator=None,
                       ec_output_aggregator=None):
        self.calls.append(method if isinstance(method, str) else method.__name__)
        if method == "take_draft_token_ids":
            return self.drafts
        if method == "sample_tokens" or method == "execute_model":
            return "output"
        worker = SimpleNamespace(sample_tokens=lambda grammar: "output",
                                 take_draft_token_ids=lambda: self.drafts)
        return method(worker, *args)


def test_drafts_come_back_with_the_sampled_tokens():
    executor = RecordingExecutor(drafts=[[5, 6]])
    assert executor.execute_model("scheduled") == "output"
    assert executor.sample_tokens(None) == "output"
    assert executor.take_draft_token_ids() == [[5, 6]]
    assert executor.calls == ["execute_model", "sample_and_take_drafts"]  # no third round trip
    # Asked again without a new step: vLLM's own RPC answers, nothing is replayed.
    assert executor.take_draft_token_ids() == [[5, 6]]
    assert executor.calls[-1] == "take_draft_token_ids"


def test_a_worker_without_drafts_answers_none_without_an_rpc():
    executor = RecordingExecutor(drafts=None)
    executor.sample_tokens(None)
    assert executor.take_draft_token_ids() is None
    assert executor.calls == ["sample_and_take_drafts"]


def test_a_new_step_drops_drafts_that_were_not_taken():
    executor = RecordingExecutor(drafts=[[1]])
    executor.sample_tokens(None)
    executor.drafts = [[2]]
    executor.execute_model("next step")
    assert executor.take_draft_token_ids() == [[2]]
    assert executor.calls[-1] == "take_draft_token_ids"


@pytest.mark.parametrize("setting", ["non_block", "kv_connector", "ec_connector", "off"])
def test_falls_back_to_separate_rpcs(setting):
    executor = RecordingExecutor(drafts=[[3]])
    if setting == "kv_connector":
        executor.kv_output_aggregator = object()
    elif setting == "ec_connector":
        executor.ec_output_aggregator = object()
    elif setting == "off":
        executor.bundles_drafts = False
    executor.sample_tokens(None, non_block=setting == "non_block")
    assert executor.take_draft_token_ids() == [[3]]
    assert executor.calls == ["sample_tokens", "take_draft_token_ids"]


def test_the_worker_samples_before_it_takes_the_drafts():
    order = []
    worker = SimpleNamespace(sample_tokens=lambda grammar: order.append(("sample", grammar)),
                             take_draft_token_ids=lambda: order.append(("take",)) or [[9]])
    assert ex.sample_and_take_drafts(worker, "bitmask") == (None, [[9]])
    assert order == [("sample", "bitmask"), ("take",)]


def test_only_synchronous_speculative_decoding_bundles():
    def config(spec, asynchronous):
        return SimpleNamespace(speculative_config=spec,
                               scheduler_config=SimpleNamespace(async_scheduling=asynchronous))

    assert ex.bundles_drafts(config(object(), False))
    assert not ex.bundles_drafts(config(None, False))
    assert not ex.bundles_drafts(config(object(), True))


def test_guards_accept_the_installed_vllm_and_refuse_changed_signatures(monkeypatch):
    assert ex.guard_problems() == []

    class Changed(ex.MultiprocExecutor):
        def sample_tokens(self, grammar_output, non_block=False, extra=None):
            pass

    problems = ex.guard_problems(Changed)
    assert len(problems) == 1 and "Changed.sample_tokens" in problems[0]
    import vllm_ext.plugin as plugin
    monkeypatch.setattr(plugin, "version_is_tested", lambda version: False)
    assert any("not a tested release" in p for p in ex.guard_problems())
