"""Prompt-lookup drafts next to the drafter's on the V1 runner (DFLASH_NGRAM_DRAFTS): P6, which
lets the propose hook (P1) see each request's tokens, and the histories it builds from them.
The choice between lookup and drafter is the core's (dflash_plugin.ngram).

Ledger
------
P6  Target:  vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer
             .prepare_next_token_ids_padded, as DFlashProposer inherits it; the override goes on
             DFlashProposer only.
    Why:     P1's propose gets no token history and no request ids. The runner calls this
             method right before propose, every drafting step, with its input batch (req_ids;
             token_ids_cpu and num_tokens_no_spec: each request's prompt and output up to the
             last step) and this step's sampled tokens ([B, K + 1], -1 past the accepted ones).
    How:     keeps references to those three arguments on the plugin's drafting state, for P1 in
             the same step, then runs the original unchanged. Only for drafters built by this
             plugin with lookup or deferred context writes on (the ids say whose context to
             skip, vllm_ext.drafting.Drafting.rows_without_context).
    Guard:   vLLM release series (or the skip-version-check override); the method's parameters
             (PREPARE_PARAMS). At run time a batch whose attributes or sizes do not fit gets no
             lookup drafts that step.
"""

from __future__ import annotations

import logging

import numpy as np

from dflash_plugin.draft_policy import DraftPolicy
from dflash_plugin.ngram import NgramDrafts
from dflash_plugin.switches import read

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

PREPARE_PARAMS = ("self", "sampled_token_ids", "requests", "gpu_input_batch",
                  "discard_request_mask")


def ngram_drafts_from_env() -> bool:
    return read("DFLASH_NGRAM_DRAFTS")


def start(policy: DraftPolicy, record_requests: bool = False) -> NgramDrafts | None:
    """The lookup side of this drafter's policy, with P6 in place; None when switched off or
    when P6's guards refuse it (logged). P6 also goes in with lookup off when
    `record_requests` (the propose hook then still reads the batch's request ids)."""
    lookup = ngram_drafts_from_env()
    if not (lookup or record_requests) or not install_history_hook():
        return None
    if not lookup:
        return None
    from vllm_ext import ngram_kernel

    ngram_kernel.warm_up()
    return NgramDrafts(policy.block, finder=ngram_kernel.find_ngram_draft)


def install_history_hook() -> bool:
    """Apply P6 once per process; True if it is (now or already) in place."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_ext.guards import patch_method

    return patch_method(  # P6
        DFlashProposer, "prepare_next_token_ids_padded", _recording_prepare,
        {"prepare_next_token_ids_padded": PREPARE_PARAMS},
        refused="n-gram drafts disabled (no token history for the propose hook)",
        applied="token history for n-gram drafts")


def _recording_prepare(original):
    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                      discard_request_mask):
        from vllm_ext.patches import _drafting_of

        drafting = _drafting_of(self)
        if drafting is not None:
            drafting.step_tokens = (gpu_input_batch, sampled_token_ids, discard_request_mask)
        return original(self, sampled_token_ids, requests, gpu_input_batch,
                        discard_request_mask)

    return prepare_next_token_ids_padded


def request_ids(step_tokens, batch: int) -> list[str] | None:
    """The request id of each of this step's rows (None when the record does not fit)."""
    if step_tokens is None:
        return None
    ids = getattr(step_tokens[0], "req_ids", None)
    if not isinstance(ids, list) or len(ids) < batch:
        return None
    return ids[:batch]


def histories(step_tokens, batch: int) -> list[np.ndarray | None]:
    """Each request's tokens up to and including the one just sampled (None for a request whose
    token was not sampled this step, e.g. a prefill chunk, or when the record does not fit)."""
    none = [None] * batch
    if step_tokens is None:
        return none
    input_batch, sampled, discard = step_tokens
    token_ids = getattr(input_batch, "token_ids_cpu", None)
    lengths = getattr(input_batch, "num_tokens_no_spec", None)
    vocab = getattr(input_batch, "vocab_size", None)
    if not isinstance(token_ids, np.ndarray) or lengths is None or sampled.shape[0] != batch \
            or len(lengths) < batch:
        return none
    sampled = sampled.cpu().numpy()
    discard = discard[:batch].cpu().numpy()
    out = []
    for i in range(batch):
        if discard[i]:
            out.append(None)
            continue
        row = sampled[i]
        bad = (row < 0) | (row >= vocab) if vocab else row < 0
        valid = int(np.argmax(bad)) if bad.any() else row.shape[0]  # accepted drafts, then bonus
        if valid == 0:
            out.append(None)
            continue
        out.append(np.concatenate([token_ids[i, :int(lengths[i])], row[:valid]]))
    return out
