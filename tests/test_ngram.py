"""Prompt-lookup drafts in the core (dflash_plugin.ngram): the matcher against a brute-force
reference, the online calibration, and the per-step choice between lookup and drafter."""

import numpy as np
import pytest
import torch

from dflash_plugin.draft_policy import (
    VLLM_CPU_COSTS,
    DraftPolicy,
    PolicyMode,
    cumulative_acceptance,
    vllm_cpu_fp32_costs,
)
from dflash_plugin.ngram import (
    NgramCalibration,
    NgramDrafts,
    NgramMatch,
    draft_value,
    expected_rate,
    find_ngram_draft,
)


def reference(history, k, min_n, max_n):
    """Brute force: the longest n first; the latest earlier occurrence; overlapping copy."""
    h = list(history)
    size = len(h)
    for n in range(max_n, min_n - 1, -1):
        if n >= size:
            continue
        suffix = h[size - n:]
        ends = [e for e in range(n - 1, size - 1) if h[e - n + 1:e + 1] == suffix]
        if ends:
            out = []
            for j in range(k):
                src = ends[-1] + 1 + j
                out.append(h[src] if src < size else out[src - size])
            return out, n
    return None


@pytest.mark.parametrize("seed", range(40))
def test_matcher_agrees_with_brute_force(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 80))
    history = rng.integers(0, int(rng.integers(2, 6)), size=size).astype(np.int32)
    min_n = int(rng.integers(1, 4))
    max_n = min_n + int(rng.integers(0, 4))
    k = int(rng.integers(1, 9))
    found = find_ngram_draft(history, k, min_n, max_n)
    expected = reference(history, k, min_n, max_n)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert found.tokens.tolist() == expected[0] and found.ngram == expected[1]
        assert found.tokens.dtype == history.dtype


def test_matcher_copies_from_the_prompt_and_repeats_loops():
    prompt = np.array([9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 2, 3])  # "... 2 3" seen after 1
    match = find_ngram_draft(prompt, 4)
    assert match == NgramMatch(match.tokens, 2) and match.tokens.tolist() == [4, 5, 6, 7]
    # max_n caps the match; the latest of the equally long ones wins
    loop = np.array([5, 1, 2, 1, 2, 1, 2])
    match = find_ngram_draft(loop, 5, 2, 3)
    assert match.ngram == 3 and match.tokens.tolist() == [1, 2, 1, 2, 1]
    assert find_ngram_draft(np.array([1, 2, 3, 4]), 3) is None  # nothing repeats
    assert find_ngram_draft(np.array([1, 2, 3, 2]), 3) is None  # 1-gram only, min_n is 2
    assert find_ngram_draft(np.array([1, 2, 3, 2]), 3, min_n=1).tokens.tolist() == [3, 2, 3]
    assert find_ngram_draft(np.array([1, 1]), 0) is None
    with pytest.raises(ValueError, match="min_n"):
        find_ngram_draft(loop, 3, 3, 2)


def test_matcher_on_a_long_history():
    rng = np.random.default_rng(0)
    history = rng.integers(0, 49152, size=4000).astype(np.int32)
    quote = history[1000:1020]
    history = np.concatenate([history, quote[:6]])  # the answer starts quoting the prompt
    match = find_ngram_draft(history, 8)
    assert match.ngram == 4 and match.tokens.tolist() == quote[6:14].tolist()


def test_calibration_learns_per_matched_length_and_position():
    calib = NgramCalibration(block=4, prior=0.5, prior_weight=4.0, decay=1.0)
    matches = [NgramMatch(np.arange(4), 4), NgramMatch(np.arange(2), 2), None]
    prior = calib.gains(matches, 4)
    assert prior[0].tolist() == pytest.approx([0.5, 0.25, 0.125, 0.0625])
    assert prior[1].tolist() == pytest.approx([0.5, 0.25, 0.0, 0.0])  # a 2-token proposal
    assert prior[2].tolist() == [0.0] * 4
    for _ in range(20):  # 4-grams: always all accepted; 2-grams: first token always rejected
        calib.observe([4, 2], [4, 3], [4, 0])
    learnt = calib.gains(matches, 4)
    assert learnt[0, 3] == pytest.approx((22 / 24) ** 4) and learnt[1, 0] == pytest.approx(2 / 24)
    # a rejected first token says nothing about the second and third of the 2-gram draft
    assert calib.tried[0, 1] == 4.0 and calib.tried[0, 0] == 24.0
    assert calib.num_drafts_seen == 40


def test_draft_value_and_rate():
    gains = cumulative_acceptance(torch.tensor([[0.9] * 4, [0.2] * 4]))
    value = draft_value(gains, 0.1)
    assert value[0] == pytest.approx(sum(0.9 ** k - 0.1 for k in range(1, 5)))
    assert value[1] == pytest.approx(0.1)  # only the first token is worth its price
    assert draft_value(torch.zeros(2, 3), 0.1).tolist() == [0.0, 0.0]
    costs = vllm_cpu_fp32_costs(16)
    rate = expected_rate(gains, [2, 0], costs, draft_pass=True)
    assert rate == pytest.approx((2 + 0.9 + 0.81) / (costs.verify_time(4) + costs.draft_time(2)))


def policy_with_curve(acceptance: float, costs=None, block=8) -> DraftPolicy:
    policy = DraftPolicy(PolicyMode.ADAPTIVE, costs or vllm_cpu_fp32_costs(block + 1), block)
    policy.curve = cumulative_acceptance(torch.full((block,), acceptance))
    return policy


def lookup(policy: DraftPolicy, **options) -> tuple[DraftPolicy, NgramDrafts]:
    return policy, NgramDrafts(policy.block, **options)


def trained(pair, rate: float, ngram: int = 4, rounds: int = 200):
    policy, drafts = pair
    for _ in range(rounds):
        drafts.observe([ngram], [policy.block], [int(rate * policy.block)])
    return pair


def copy_match(block=8, ngram=4):
    return NgramMatch(np.arange(block), ngram)


def test_lookup_alone_when_it_beats_running_the_drafter():
    # A copying request: lookup right nearly always; the drafter mediocre lately.
    policy, drafts = trained(lookup(policy_with_curve(0.5)), 1.0)
    lengths = drafts.plan_without_draft_pass(policy, [copy_match()], 8, drafter_runs=True)
    assert lengths == [8] and drafts.counts.steps_without_draft_pass == 1
    # Without a match, or in the other policy modes, the drafter's policy decides alone.
    assert drafts.plan_without_draft_pass(policy, [None], 8, drafter_runs=True) is None
    for mode in (PolicyMode.FULL, PolicyMode.OFF):
        other = DraftPolicy(mode, vllm_cpu_fp32_costs(9), 8)
        assert drafts.plan_without_draft_pass(other, [copy_match()], 8, False) is None


def test_drafter_keeps_the_step_when_it_is_expected_to_bring_more():
    # Untrained lookup (prior 0.5 per token) against a drafter right 90% of the time.
    policy, drafts = lookup(policy_with_curve(0.9))
    assert drafts.plan_without_draft_pass(policy, [copy_match()], 8, drafter_runs=True) is None
    # The policy would not run the drafter (too costly here): lookup drafts are still free.
    lengths = drafts.plan_without_draft_pass(policy, [copy_match()], 8, drafter_runs=False)
    assert lengths is not None and 1 <= lengths[0] <= 8
    # A lookup that is always wrong is not verified even for free.
    policy, wrong = trained(lookup(policy_with_curve(0.9)), 0.0)
    assert wrong.plan_without_draft_pass(policy, [copy_match()], 8, drafter_runs=False) is None


def test_after_the_pass_each_request_takes_the_better_draft():
    policy, drafts = trained(lookup(policy_with_curve(0.7)), 1.0)
    drafter = cumulative_acceptance(torch.tensor([[0.95] * 8, [0.3] * 8, [0.3] * 8]))
    matches = [copy_match(), copy_match(), None]
    mixed, take = drafts.choose(policy, drafter, matches)
    # request 0: both look good, the lookup's learnt 4-gram rate is higher; request 1: the
    # drafter is unsure, the lookup wins; request 2: no match
    assert take == [True, True, False]
    assert torch.equal(mixed[2], drafter[2]) and mixed[1, 7] > 0.9
    policy, bad = trained(lookup(policy_with_curve(0.7)), 0.0)
    mixed, take = bad.choose(policy, drafter, matches)
    assert take == [False, False, False] and torch.equal(mixed, drafter)


def test_lookup_is_tried_now_and_then_while_the_drafter_wins():
    policy, drafts = lookup(policy_with_curve(0.7), explore_every=3)
    drafter = cumulative_acceptance(torch.full((1, 8), 0.99))
    takes = [drafts.choose(policy, drafter, [copy_match()])[1] for _ in range(6)]
    assert takes == [[False], [False], [True], [False], [False], [True]]
    # no match: nothing to explore
    assert drafts.choose(policy, drafter, [None])[1] == [False]


def test_counts_summary():
    _, drafts = lookup(policy_with_curve(0.5, VLLM_CPU_COSTS))
    drafts.handed_out([3, 0, 2])
    drafts.observe([4, 2], [3, 2], [3, 1])
    assert drafts.counts.summary() == ("n-gram: 2 drafts (5 tokens, 4 accepted; 0 drafts "
                                       "retrieved, 0 of their tokens accepted), 0 steps "
                                       "without a draft pass")


def test_retrieved_drafts_fill_in_for_lookup_and_win_where_calibrated_better():
    from dflash_plugin.datastore import AnswerDatastore

    block = 6
    # The target once answered "... 21 22 23 24 25 26 27 28": a history ending in 21 22 23
    # retrieves 24 25 ...; one ending in 1 2 3 has no answer to retrieve from.
    datastore = AnswerDatastore.build([[20, 21, 22, 23, 24, 25, 26, 27, 28]], continuation=block)
    drafts = NgramDrafts(block, datastore=datastore)
    lookup = NgramMatch(np.array([90, 91, 92, 93, 94, 95]), 4)
    tails = np.array([[0, 0, 21, 22, 23], [0, 0, 21, 22, 23], [0, 0, 1, 2, 3]])
    sizes = np.array([3, 3, 3])
    matches = drafts.with_retrieved([None, lookup, lookup], tails, sizes, VLLM_CPU_COSTS, block)
    # row 0: no lookup, so the retrieved draft; row 1: both at the same prior, lookup stays;
    # row 2: nothing retrieved
    assert matches[0].retrieved and matches[0].tokens.tolist() == [24, 25, 26, 27, 28]
    assert matches[0].ngram == 3
    assert matches[1] is lookup and matches[2] is lookup
    # Verification shows lookup drafts of 4-grams failing and retrieved 3-gram drafts right:
    # each is learnt in its own rows, and the retrieved draft now wins row 1.
    for _ in range(40):
        drafts.observe([4, 3], [block, block], [0, block], [False, True])
    assert drafts.calibration.gains([lookup], block)[0, 0] < 0.1
    retrieved = drafts.calibration.gains([matches[0]], block)[0]
    assert retrieved[0] > 0.9 and retrieved[4] > 0.75 and retrieved[5] == 0  # 5 tokens drafted
    assert drafts.calibration.gains([NgramMatch(np.arange(6), 3)], block)[0, 0] == 0.5  # prior
    matches = drafts.with_retrieved([None, lookup, lookup], tails, sizes, VLLM_CPU_COSTS, block)
    assert matches[1].retrieved and matches[2] is lookup
    assert drafts.counts.retrieved_tokens_accepted == 40 * block
    drafts.handed_out([5, 3], [True, False])
    assert drafts.counts.retrieved_handed_out == 1 and drafts.counts.drafts_handed_out == 2
    # without a datastore the matches are left as they are
    assert NgramDrafts(block).with_retrieved([None], tails[:1], sizes[:1], VLLM_CPU_COSTS,
                                             block) == [None]


def test_retrieved_drafts_are_calibrated_by_their_share():
    from dflash_plugin.datastore import AnswerDatastore

    block = 4
    # "1 2 3" went on with 4 three times and with 9 once (share 0.75); "5 6 7" always with 8.
    answers = [[1, 2, 3, 4, 0, 0], [1, 2, 3, 4, 0, 1], [1, 2, 3, 4, 1, 1], [1, 2, 3, 9, 9, 9],
               [5, 6, 7, 8, 8, 8]]
    drafts = NgramDrafts(block, datastore=AnswerDatastore.build(answers, continuation=block))
    tails = np.array([[1, 2, 3], [5, 6, 7]])
    found = drafts.with_retrieved([None, None], tails, np.array([3, 3]), VLLM_CPU_COSTS, block)
    assert [m.share for m in found] == [0.75, 1.0]
    assert all(m.retrieved and m.ngram == 3 for m in found)
    # Verification: the sure 3-gram drafts pass, the split ones fail at once. The same n-gram
    # length learns two chances, one per share band.
    for _ in range(40):
        drafts.observe([3, 3], [block, block], [0, block], [True, True], [0.75, 1.0])
    gains = drafts.calibration.gains(found, block)
    assert gains[0, 0] < 0.1 and gains[1, 0] > 0.9
    assert drafts.calibration._row(3, True, 0.5) == drafts.calibration._row(3, True, 0.69)
    assert len({drafts.calibration._row(3, True, s) for s in (0.5, 0.75, 0.9, 1.0)}) == 3
    # lookup rows stay apart from every retrieved band
    assert drafts.calibration.gains([NgramMatch(np.arange(4), 3)], block)[0, 0] == 0.5
