"""Greedy speculative decoding on the real SmolLM2 target (float32) emits exactly the tokens of
plain greedy decoding: with a random drafter (every draft rejected) and with scripted drafts
(the known continuation with deliberate mistakes) that exercise multi-token and partial
acceptance, EOS inside a block, and max_new_tokens inside a block."""

import pytest
from core_helpers import EOS, PLAIN_MAX_NEW, PROMPTS, ProposingDecoder

from dflash_plugin.generate import SpecDecoder, generate_plain

pytestmark = pytest.mark.slow

MAX_NEW = PLAIN_MAX_NEW  # the length of the shared plain references (conftest.plain_results)


def one_setting_per_prompt(settings):
    """(prompt, setting) pairs: prompt i gets settings[i % len(settings)]. Every prompt and every
    setting is checked, and each setting sees outputs ending at EOS and at max_new_tokens
    (test_each_setting_sees_both_finish_reasons), without the whole cross product: each pair
    decodes for seconds on the real target."""
    return [(i, settings[i % len(settings)]) for i in range(len(PROMPTS))]


RANDOM_BLOCKS = [4, 8, 16]
# (drafter block, tokens per verify pass): full blocks, and a 16-token draft of which only the
# first 2 drafts are verified (--speculative-num-draft-tokens 3).
TRAINED_SETTINGS = [(4, 4), (16, 16), (16, 3)]


@pytest.mark.parametrize("prompt, block_size", one_setting_per_prompt(RANDOM_BLOCKS))
def test_random_drafter_matches_plain(target_f32, drafter_f32, chat_prompts, plain_results,
                                      prompt, block_size):
    plain = plain_results(prompt)
    spec = SpecDecoder(target_f32, drafter_f32, block_size=block_size).generate(
        chat_prompts[prompt], MAX_NEW, stop_token_ids={EOS})
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason
    assert spec.stats.num_steps == spec.num_target_passes - 1
    assert all(1 <= tau <= block_size for tau in spec.stats.accept_lengths)


@pytest.mark.parametrize("prompt, setting", one_setting_per_prompt(TRAINED_SETTINGS))
def test_trained_drafter_matches_plain(target_f32, shipped_drafter_f32, chat_prompts,
                                       plain_results, prompt, setting):
    """The shipped drafter gets drafts accepted, and the output is still the target's own."""
    block_size, num_verify = setting
    plain = plain_results(prompt)
    spec = SpecDecoder(target_f32, shipped_drafter_f32, block_size=block_size,
                       num_verify_tokens=num_verify).generate(chat_prompts[prompt], MAX_NEW,
                                                              stop_token_ids={EOS})
    assert spec.token_ids == plain.token_ids
    assert spec.finish_reason == plain.finish_reason
    assert all(1 <= tau <= num_verify for tau in spec.stats.accept_lengths)
    assert spec.stats.drafted_tokens <= (num_verify - 1) * spec.stats.num_steps


def test_verifying_fewer_tokens_keeps_the_drafts_of_the_full_block(target_f32,
                                                                   shipped_drafter_f32,
                                                                   chat_prompts):
    """The drafter still fills its whole trained block: the verified drafts are the first
    drafts of that block, not a shorter block's."""
    import torch

    from dflash_plugin.errors import DFlashError

    full = SpecDecoder(target_f32, shipped_drafter_f32)
    short = SpecDecoder(target_f32, shipped_drafter_f32, num_verify_tokens=3)
    ids = chat_prompts[0]
    with torch.inference_mode():
        features = full.capture.active()
        with features:
            target_f32(ids, use_cache=False)
            context = shipped_drafter_f32.fuse_context(full.capture.take())
        start, bonus = ids.shape[1], 42
        whole = full.draft(bonus, start, context, shipped_drafter_f32.new_cache(), 16)
        first = short.draft(bonus, start, context, shipped_drafter_f32.new_cache(), 16, 2)
    assert first.tolist() == whole[:2].tolist()
    for bad in (1, 17):
        with pytest.raises(DFlashError, match="tokens per verify pass"):
            SpecDecoder(target_f32, shipped_drafter_f32, num_verify_tokens=bad)


def test_trained_drafter_gets_drafts_accepted(target_f32, shipped_drafter_f32, chat_prompts):
    spec = SpecDecoder(target_f32, shipped_drafter_f32).generate(chat_prompts[0], MAX_NEW,
                                                                 stop_token_ids={EOS})
    assert spec.stats.mean_accept_length > 1.0


@pytest.mark.parametrize("settings", [RANDOM_BLOCKS, TRAINED_SETTINGS])
def test_each_setting_sees_both_finish_reasons(plain_results, settings):
    for setting in settings:
        reasons = {plain_results(i).finish_reason
                   for i, s in one_setting_per_prompt(settings) if s == setting}
        assert reasons == {"stop", "length"}, setting


# ---- scripted drafts ------------------------------------------------------------------------

REF_LEN = 48  # continuation known beyond max_new_tokens + block size


@pytest.fixture(scope="module")
def continuations(target_f32, chat_prompts):
    """Plain greedy continuations without stop tokens, so the tokens after EOS are known too."""
    cache = {}

    def get(i):
        if i not in cache:
            cache[i] = generate_plain(target_f32, chat_prompts[i], REF_LEN).token_ids
        return cache[i]
    return get


def expected_accept_lengths(block_size, wrong, max_new, stop_index):
    """tau per round when every draft is right except at output indices in `wrong`."""
    def finished(last):  # last = index of the last emitted token
        return (stop_index is not None and stop_index <= last) or last + 1 >= max_new

    taus, bonus = [], 0
    while not finished(bonus):
        block = min(block_size, max_new - bonus)
        n = 0
        while n < block - 1 and bonus + 1 + n not in wrong:
            n += 1
        taus.append(n + 1)
        bonus += n + 1
    return taus


CASES = [
    # prompt, block size, wrong draft indices, max_new_tokens, stop on EOS
    (0, 8, (), 30, True),           # EOS inside the first block: one verify pass
    (0, 4, (), 30, True),           # full blocks, then EOS inside a block
    (0, 16, (3,), 30, True),        # partial, then EOS inside
    (0, 4, (1, 2, 5), 30, True),    # rejections at the very first drafts
    (2, 16, (), 21, False),         # full block, then max_new_tokens inside a block
    (2, 8, (4, 10, 11), 21, False),
    (2, 16, (15, 16, 17), 40, False),  # miss on the last draft of a block
    (2, 4, tuple(range(1, 13)), 12, False),  # every draft wrong: one token per pass
    (2, 16, (7,), 1, False),        # max_new_tokens = 1: no verify pass at all
]


@pytest.mark.parametrize("prompt, block_size, wrong, max_new, stop", CASES)
def test_scripted_drafts_match_plain(target_f32, drafter_f32, chat_prompts, continuations,
                                     prompt, block_size, wrong, max_new, stop):
    ref = continuations(prompt)
    vocab = target_f32.config.vocab_size

    def propose(seq):
        index = len(seq)
        return (ref[index] + 1) % vocab if index in wrong else ref[index]

    ids = chat_prompts[prompt]
    decoder = ProposingDecoder(target_f32, drafter_f32, block_size, ids.shape[1], propose)
    stops = {EOS} if stop else set()
    result = decoder.generate(ids, max_new, stop_token_ids=stops)

    stop_index = ref.index(EOS) if stop and EOS in ref else None
    end = max_new if stop_index is None else min(max_new, stop_index + 1)
    assert result.token_ids == ref[:end]
    assert result.finish_reason == ("stop" if stop_index is not None and stop_index < max_new
                                    else "length")
    taus = expected_accept_lengths(block_size, set(wrong), max_new, stop_index)
    assert result.stats.accept_lengths == taus
    assert result.num_target_passes == 1 + len(taus)
    for committed, bonus, _ in decoder.rounds:  # the loop's state followed the reference
        assert committed + [bonus] == ref[:len(committed) + 1]


def test_scripted_cases_exercise_the_interesting_paths(continuations):
    ref0, ref2 = continuations(0), continuations(2)
    assert EOS in ref0[:8], "prompt 0 must end within the first block of 8"
    assert EOS not in ref2[:40], "prompt 2 must run past 40 tokens"
    multi = expected_accept_lengths(16, set(), 21, None)
    assert max(multi) == 16 and multi[-1] < 16
