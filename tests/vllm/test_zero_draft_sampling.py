"""P2 (vllm_ext/zero_draft_sampling.py) against vLLM's real rejection sampler: for a step that
verifies no drafts the short cut returns exactly the original's tokens, greedy and seeded
sampling alike, and every other step still goes through the original."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

VOCAB = 512


def sampling_metadata(batch: int, temperature: float | None, seeds: list[int] | None = None,
                      max_num_logprobs: int | None = None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    greedy = temperature is None
    generators = {}
    for index, seed in enumerate(seeds or []):
        generators[index] = torch.Generator().manual_seed(seed)
    empty = torch.zeros(batch)
    return SamplingMetadata(
        temperature=None if greedy else torch.full((batch,), temperature),
        all_greedy=greedy, all_random=not greedy, top_p=None, top_k=None,
        generators=generators, max_num_logprobs=max_num_logprobs, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=empty, presence_penalties=empty,
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
        spec_token_ids=[[] for _ in range(batch)])


@pytest.fixture(scope="module")
def samplers():
    """(patched forward, original forward, a rejection sampler) with P2 installed."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from vllm_ext.guards import PATCH_MARKER
    from vllm_ext.zero_draft_sampling import install_zero_draft_sampling

    # As the CPU worker does at start-up: C++ kernels in place of Triton's where it has no CPU
    # backend (the original rejection sampler launches them).
    current_platform.register_triton_kernel_overrides()
    assert install_zero_draft_sampling() and install_zero_draft_sampling()  # idempotent
    patched = RejectionSampler.forward
    return patched, getattr(patched, PATCH_MARKER), RejectionSampler(Sampler())


def metadata_for(drafts: list[list[int]]):
    """A step's metadata with the logits rows a real step has: each request's draft rows, then
    its bonus row (make_dummy, meant for warm-up runs, leaves every index at row 0)."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    meta = SpecDecodeMetadata.make_dummy(drafts, device=torch.device("cpu"))
    ends = meta.cu_num_sampled_tokens.long()
    starts = ends - torch.tensor([len(d) + 1 for d in drafts])
    meta.bonus_logits_indices = (ends - 1).to(torch.int32)
    meta.target_logits_indices = torch.cat(
        [torch.arange(int(a), int(b) - 1) for a, b in zip(starts, ends)]).to(torch.int32)
    meta.logits_indices = torch.arange(int(ends[-1]), dtype=torch.int32)
    return meta


def run_both(samplers, drafts, make_metadata):
    """Tokens from the patched and the original forward, each on fresh copies of the inputs
    (the sampler may update logits in place, and generators advance)."""
    from vllm_ext.zero_draft_sampling import ShortCutCounter

    patched, original, sampler = samplers
    torch.manual_seed(1)
    rows = sum(len(d) + 1 for d in drafts)
    logits = torch.randn(rows, VOCAB) * 3
    before = ShortCutCounter.steps
    ours = patched(sampler, metadata_for(drafts), None, logits.clone(), make_metadata())
    short_cut = ShortCutCounter.steps - before
    theirs = original(sampler, metadata_for(drafts), None, logits.clone(), make_metadata())
    return ours, theirs, short_cut


@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_step_without_drafts_matches_original(samplers, batch):
    drafts = [[] for _ in range(batch)]
    ours, theirs, short_cut = run_both(samplers, drafts, lambda: sampling_metadata(batch, None))
    assert short_cut == 1
    assert ours.sampled_token_ids.dtype == theirs.sampled_token_ids.dtype == torch.int32
    assert torch.equal(ours.sampled_token_ids, theirs.sampled_token_ids)
    assert ours.logprobs_tensors is None and theirs.logprobs_tensors is None


def test_seeded_sampling_without_drafts_matches_original(samplers):
    batch = 4
    make = lambda: sampling_metadata(batch, 1.0, seeds=[11, 12, 13, 14])  # noqa: E731
    ours, theirs, short_cut = run_both(samplers, [[] for _ in range(batch)], make)
    assert short_cut == 1
    assert torch.equal(ours.sampled_token_ids, theirs.sampled_token_ids)
    # Seeds matter here, so equality is not an accident of one likely token.
    other = run_both(samplers, [[] for _ in range(batch)],
                     lambda: sampling_metadata(batch, 1.0, seeds=[21, 22, 23, 24]))[0]
    assert not torch.equal(ours.sampled_token_ids, other.sampled_token_ids)


@pytest.mark.parametrize("case", ["drafts", "logprobs"])
def test_other_steps_take_the_original(samplers, case):
    drafts = [[5, 6], [], [7]] if case == "drafts" else [[], [], []]
    logprobs = 2 if case == "logprobs" else None
    ours, theirs, short_cut = run_both(
        samplers, drafts, lambda: sampling_metadata(3, None, max_num_logprobs=logprobs))
    assert short_cut == 0
    assert torch.equal(ours.sampled_token_ids, theirs.sampled_token_ids)
    if case == "drafts":
        assert ours.sampled_token_ids.shape == (3, 3)


def test_short_cut_samples_the_logits_in_place_like_plain_decoding(samplers, monkeypatch):
    """No B x vocab copy per step: the plain sampler gets the runner's logits tensor itself."""
    patched, _, sampler = samplers
    seen = []
    plain_forward = sampler.sampler.forward

    def spy(logits, sampling_metadata, *args, **kwargs):
        seen.append(logits)
        return plain_forward(logits, sampling_metadata, *args, **kwargs)

    monkeypatch.setattr(sampler.sampler, "forward", spy)
    logits = torch.randn(3, VOCAB)
    out = patched(sampler, metadata_for([[], [], []]), None, logits, sampling_metadata(3, None))
    assert seen and seen[0] is logits
    assert torch.equal(out.sampled_token_ids[:, 0].long(), logits.argmax(dim=-1))


def test_guard_names_a_changed_signature():
    from vllm_ext.zero_draft_sampling import guard_problems

    class Renamed:
        def forward(self, metadata, draft_probs, target_logits, sampling_metadata):
            pass

    problems = guard_problems(Renamed)
    assert len(problems) == 1 and "Renamed.forward has parameters" in problems[0]
