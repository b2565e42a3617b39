"""The vLLM adapter's per-step bookkeeping (engine-free): drafts handed out and learnt from,
the step counts it logs, and its environment switches."""

import pytest
import torch

from dflash_plugin.draft_policy import CPU_COSTS, DraftPolicy, PolicyMode
from vllm_ext.drafting import Drafting

BLOCK = 4


def step(drafting, query_lens, rejected=None):
    """The propose call of one step: what the target just processed, per request."""
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    ids = torch.arange(int(starts[-1]))
    drafting.learn(ids, starts, None if rejected is None else torch.tensor(rejected))


def test_draft_vocabulary_switch_from_the_environment(monkeypatch):
    from vllm_ext.drafting import draft_vocab_from_env

    monkeypatch.delenv("DFLASH_DRAFT_VOCAB", raising=False)
    assert draft_vocab_from_env()  # the checkpoint's training vocabulary when it has one
    monkeypatch.setenv("DFLASH_DRAFT_VOCAB", "full")
    assert not draft_vocab_from_env()
    monkeypatch.setenv("DFLASH_DRAFT_VOCAB", "tiny")
    with pytest.raises(ValueError, match="DFLASH_DRAFT_VOCAB='tiny'"):
        draft_vocab_from_env()


def test_step_counts_are_logged_every_n_steps(caplog):
    drafting = Drafting(DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK), stats_every=3)
    step(drafting, [1, 1])
    drafting.skipped()
    step(drafting, [1, 1], rejected=[0, 0])
    drafting.confidence = torch.full((2 * BLOCK,), 0.99)  # a confident drafter
    selected = drafting.select(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([1, 2]))
    assert selected == [[5, 6, 7, 8]] * 2
    counts = drafting.counts
    assert (counts.steps, counts.draft_passes, counts.empty_passes) == (2, 1, 0)
    assert counts.drafts_handed_out == 8
    with caplog.at_level("INFO", logger="vllm.vllm_ext.drafting"):
        # third step (verifying what was handed out): logged, then a new window
        drafting.learn(torch.tensor([1, 5, 6, 7, 8, 2, 5, 6, 7, 8]), torch.tensor([0, 5, 10]),
                       torch.tensor([1, 3]))
    assert ("3 steps (0 without drafter inputs): 1 draft passes (0 handed out nothing), 8 "
            "drafts verified, 4 accepted") \
        in caplog.text
    # The confident drafts taught the policy: both requests' confidences were matched.
    assert drafting.policy.calibration.num_drafts_seen == 2
    assert drafting.counts.steps == 0


def test_full_mode_counts_accepted_drafts_without_reading_confidences():
    drafting = Drafting(DraftPolicy(PolicyMode.FULL, CPU_COSTS, BLOCK))
    step(drafting, [1, 1])
    selected = drafting.select(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([1, 2]))
    assert selected == [[5, 6, 7, 8]] * 2
    drafting.learn(torch.tensor([1, 5, 6, 7, 8, 2, 5, 6, 7, 8]), torch.tensor([0, 5, 10]),
                   torch.tensor([4, 1]))
    assert drafting.counts.drafts_accepted == 0 + 3  # nothing of the first, 3 of the second
    assert drafting.policy.calibration.num_drafts_seen == 0  # no confidences: nothing learnt


def test_stats_interval_from_the_environment(monkeypatch):
    from vllm_ext.drafting import stats_every_from_env

    monkeypatch.delenv("DFLASH_STATS_EVERY", raising=False)
    assert stats_every_from_env() == 2000
    monkeypatch.setenv("DFLASH_STATS_EVERY", "0")
    assert stats_every_from_env() == 0
    monkeypatch.setenv("DFLASH_STATS_EVERY", "-5")
    with pytest.raises(ValueError, match="DFLASH_STATS_EVERY='-5'"):
        stats_every_from_env()


def test_draft_passes_are_booked_with_what_verification_accepted():
    drafting = Drafting(DraftPolicy(PolicyMode.ADAPTIVE, CPU_COSTS, BLOCK))
    booked = []
    drafting.policy.pass_outcome = lambda *outcome: booked.append(outcome)
    step(drafting, [1, 1])
    drafting.confidence = torch.full((2 * BLOCK,), 0.99)
    drafting.select(torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), torch.tensor([1, 2]))
    assert booked == []  # booked once verification reports back
    drafting.learn(torch.tensor([1, 5, 6, 7, 8, 2, 5, 6, 7, 8]), torch.tensor([0, 5, 10]),
                   torch.tensor([1, 3]))
    assert booked == [(2, 8, 3 + 1)]
    # a pass that hands out nothing is booked at once, with nothing verified or accepted
    drafting.confidence = torch.full((2 * BLOCK,), 1e-4)
    assert drafting.select(torch.tensor([[5, 6, 7, 8]] * 2), torch.tensor([1, 2])) == [[], []]
    assert booked[-1] == (2, 0, 0)
