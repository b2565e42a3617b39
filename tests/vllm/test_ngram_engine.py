"""Prompt-lookup drafts (DFLASH_NGRAM_DRAFTS=on) in a real vLLM engine on the SmolLM2 target:
greedy output token-identical to plain decoding, on copy-heavy prompts where lookup drafts are
actually verified, alone and in a batch with ordinary prompts, also where steps skip vLLM's
drafter-input preparation (P8); and sampled output (T = 1) with lookup drafts forced is the
target's distribution."""

from __future__ import annotations

import pytest
from engine_helpers import engine, environment, shipped_drafter

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]

ENGINE_ARGS = dict(dtype="float32", max_model_len=1024, seed=0, max_num_seqs=8,
                   kv_cache_memory_bytes=1 << 30, enforce_eager=True)
MAX_TOKENS = 48
K = 7
PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a "
           "tin of oil and a cloth for the lens. Ships passing the rocky point counted on the "
           "beam, and in forty years it had never once gone dark.")
COPY_PROMPTS = [f"Repeat this text exactly, word for word: {PASSAGE}",
                f"Copy the following sentence without changing anything:\n\n{PASSAGE}"]
OTHER_PROMPTS = ["Write a haiku about rain.", "What is a compiler?"]


def answers(llm, prompt_sets):
    """Greedy answers (token ids) of each prompt set, one chat call per set."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [[list(o.outputs[0].token_ids) for o in
             llm.chat([[{"role": "user", "content": p}] for p in prompts], params,
                      use_tqdm=False)]
            for prompts in prompt_sets]


def lookup_state():
    # Defined in a function so cloudpickle ships it by value to the worker.
    def state(worker):
        drafting = worker.model_runner.drafter.model.dflash_drafting
        ngram = drafting.ngram
        return None if ngram is None else dict(
            lookup_drafts_verified=ngram.calibration.num_drafts_seen,
            drafter_drafts_verified=drafting.policy.calibration.num_drafts_seen,
            plain_steps=drafting.counts.plain_steps, steps=drafting.counts.steps)

    return state


# Two prompts sharing a prefix of several KV-cache blocks (128 tokens each on vLLM-CPU): the
# second is answered after the first, so its prefix comes from the prefix cache.
SHARED = " ".join([PASSAGE] * 6)
CACHED_PROMPTS = [f"{SHARED}\n\nSummarise this in one sentence.",
                  f"{SHARED}\n\nWhat does the keeper carry?"]


def cached_answers(llm):
    """(greedy tokens, prompt tokens served from the prefix cache) of each CACHED_PROMPTS
    request, answered one after the other."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    outs = [llm.generate([p], params, use_tqdm=False)[0] for p in CACHED_PROMPTS]
    return [(list(o.outputs[0].token_ids), o.num_cached_tokens) for o in outs]


def no_draft_passes():
    def hopeless(worker):
        """A policy under which no draft pass ever pays: requests get no drafter context, so
        every step that verified nothing takes P8's short cut (lookup drafts still run)."""
        policy = worker.model_runner.drafter.model.dflash_drafting.policy
        policy.should_draft = lambda batch: False
        policy.passes_closed = lambda batch: True
        policy.passes_hopeless = lambda batch: True

    return hopeless


@pytest.fixture(scope="module")
def runs(target_path, plain_llm):
    drafter = shipped_drafter()
    if drafter is None:
        pytest.skip("needs the shipped drafter")
    prompt_sets = [[p] for p in COPY_PROMPTS] + [COPY_PROMPTS + OTHER_PROMPTS]
    plain = answers(plain_llm, prompt_sets)
    plain_cached = cached_answers(plain_llm)
    # As `dflash serve` configures DFlash: the prefix cache's last block is not dropped
    with environment(DFLASH_NGRAM_DRAFTS="on", DFLASH_STATS_EVERY="0",
                     VLLM_ALLOW_INSECURE_SERIALIZATION="1"), \
            engine(target_path, drafter, num_speculative_tokens=K,
                   speculative=dict(disable_eagle_block_drop=True), **ENGINE_ARGS) as llm:
        hybrid = answers(llm, prompt_sets)
        state = llm.collective_rpc(lookup_state())[0]
        hybrid_cached = cached_answers(llm)
        llm.collective_rpc(no_draft_passes())
        plain_steps = answers(llm, prompt_sets[-1:])
        after = llm.collective_rpc(lookup_state())[0]
    return dict(plain=plain, hybrid=hybrid, state=state, plain_steps=plain_steps,
                after=after, plain_cached=plain_cached, hybrid_cached=hybrid_cached)


def test_lookup_drafts_keep_greedy_output_identical(runs):
    assert runs["hybrid"] == runs["plain"]


def test_lookup_drafts_were_verified(runs):
    state = runs["state"]
    assert state is not None, "DFLASH_NGRAM_DRAFTS=on built no lookup"
    assert state["lookup_drafts_verified"] > 0


def test_prefix_cache_serves_drafted_requests_as_it_serves_plain_ones(runs):
    # DFlash's drafter reads no target state of the last cached token (its context is K/V in
    # the cache), so the prefix cache need not drop the last block as for EAGLE: the second
    # request gets as many cached tokens as under plain decoding, and the same answer.
    plain, hybrid = runs["plain_cached"], runs["hybrid_cached"]
    assert plain[1][1] >= 2 * 128, "the shared prefix should span cache blocks"
    assert [cached for _, cached in hybrid] == [cached for _, cached in plain]
    assert [tokens for tokens, _ in hybrid] == [tokens for tokens, _ in plain]


def test_steps_without_drafter_inputs_keep_greedy_output_identical(runs):
    # With no draft pass to expect and no drafter context, steps that verified nothing skip
    # vLLM's drafter-input preparation (P8) and hand out lookup drafts directly: still
    # lossless, and lookup drafts from those steps were verified.
    before, after = runs["state"], runs["after"]
    assert runs["plain_steps"] == runs["plain"][-1:]
    assert after["plain_steps"] - before["plain_steps"] >= MAX_TOKENS // 4
    assert after["lookup_drafts_verified"] > before["lookup_drafts_verified"]
    assert after["drafter_drafts_verified"] == before["drafter_drafts_verified"]


# Retrieved drafts (DFLASH_DATASTORE): a datastore of the target's own greedy answers to the
# same prompts drafts their continuations; half of those answers are altered every fifth token,
# so that some retrieved drafts go wrong and verification must reject them.
def retrieval_state():
    def state(worker):
        counts = worker.model_runner.drafter.model.dflash_drafting.ngram.counts
        return dict(retrieved=counts.retrieved_handed_out,
                    retrieved_accepted=counts.retrieved_tokens_accepted,
                    drafts=counts.drafts_handed_out)

    return state


@pytest.fixture(scope="module")
def retrieval(runs, target_path, tmp_path_factory):
    import json

    plain = runs["plain"][-1]  # COPY_PROMPTS + OTHER_PROMPTS in one batch
    answers = tmp_path_factory.mktemp("datastore") / "answers.jsonl"
    with answers.open("w") as f:
        for i, tokens in enumerate(plain):
            altered = [t if i % 2 == 0 or j % 5 != 4 else (t + 1) % 1000
                       for j, t in enumerate(tokens)]
            f.write(json.dumps({"response_ids": altered}) + "\n")
    # Verification nearly free in the cost model, so that drafts are verified in a batch of 4
    with environment(DFLASH_NGRAM_DRAFTS="on", DFLASH_STATS_EVERY="0",
                     DFLASH_DATASTORE=str(answers), VLLM_ALLOW_INSECURE_SERIALIZATION="1",
                     DFLASH_COST_MODEL=("verify_per_token=0.001,min_speedup=1.0,"
                                        "min_speedup_batched=1.0")), \
            engine(target_path, shipped_drafter(), num_speculative_tokens=K,
                   speculative=dict(disable_eagle_block_drop=True), **ENGINE_ARGS) as llm:
        out = answers_of(llm)
        state = llm.collective_rpc(retrieval_state())[0]
    return dict(out=out, state=state, plain=plain)


def answers_of(llm):
    return answers(llm, [COPY_PROMPTS + OTHER_PROMPTS])[0]


def test_retrieved_drafts_keep_greedy_output_identical(retrieval):
    print(f"retrieval state: {retrieval['state']}")
    assert retrieval["out"] == retrieval["plain"]
    state = retrieval["state"]
    assert state["retrieved"] > 0, "the datastore of these very answers drafted nothing"
    assert state["retrieved_accepted"] > 0


# Sampling (T = 1): lookup drafts verified by vLLM's rejection sampler must leave the target's
# distribution as it is. The same two-sample chi-square test as tests/vllm/
# test_sampling_distribution.py, with lookup drafts forced on every step that has a match.
REPEATING_PROMPT = "one two three, one two three, one two three, one two"
N = 400
SAMPLED_TOKENS = 4


def force_lookup():
    def force(worker):
        """Lookup judged always right, whatever verification shows (a huge prior), and
        matching single tokens too, so that most steps verify a lookup draft."""
        ngram = worker.model_runner.drafter.model.dflash_drafting.ngram
        ngram.min_n = 1
        ngram.calibration.tried.fill_(1e12)
        ngram.calibration.accepted.fill_(1e12)

    def accept_every_draft(worker):
        import torch
        from vllm.v1.sample import rejection_sampler

        def zeros(num_tokens, num_draft_tokens, generators, device):
            return torch.zeros(num_tokens, dtype=torch.float64, device=device)

        rejection_sampler.generate_uniform_probs = zeros

    return force, accept_every_draft


def sample(llm):
    from vllm import SamplingParams

    params = [SamplingParams(seed=i, temperature=1.0, max_tokens=SAMPLED_TOKENS, ignore_eos=True)
              for i in range(N)]
    return [tuple(o.outputs[0].token_ids)
            for o in llm.generate([REPEATING_PROMPT] * N, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def samples(target_path, plain_llm):
    drafter = shipped_drafter()
    if drafter is None:
        pytest.skip("needs the shipped drafter")
    args = dict(ENGINE_ARGS, max_model_len=256, max_num_seqs=128)
    force, accept_every_draft = force_lookup()
    results = {}
    results["plain"] = sample(plain_llm)
    # Verification nearly free in the cost model, so that lookup drafts are verified at any
    # batch size (the preset would verify none with 128 requests in the step).
    with environment(VLLM_ALLOW_INSECURE_SERIALIZATION="1", DFLASH_NGRAM_DRAFTS="on",
                     DFLASH_STATS_EVERY="0", DFLASH_COST_MODEL=(
                         "verify_per_token=0.001,min_speedup=1.0,min_speedup_batched=1.0")), \
            engine(target_path, drafter, num_speculative_tokens=K, **args) as llm:
        llm.collective_rpc(force)
        results["hybrid"] = sample(llm)
        results["state"] = llm.collective_rpc(lookup_state())[0]
        llm.collective_rpc(accept_every_draft)
        results["wrong"] = sample(llm)
    return results


def test_lookup_drafts_keep_the_targets_distribution(samples):
    from test_sampling_distribution import ALPHA, position_p_values

    print(f"lookup state: {samples['state']}")
    assert samples["state"]["lookup_drafts_verified"] >= N // 2
    p_values = position_p_values(samples["hybrid"], samples["plain"])
    print(f"lookup vs plain p-values per position 2..{SAMPLED_TOKENS}: {p_values}")
    assert min(p_values) > ALPHA, p_values
    # ... and the test can see a wrong acceptance rule on these drafts
    wrong = position_p_values(samples["wrong"], samples["plain"])
    print(f"accept-every-draft vs plain p-values: {wrong}")
    assert min(wrong) < ALPHA, wrong
