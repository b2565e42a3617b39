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
import time
from pathlib import Path

import numpy as np

from dflash_plugin.datastore import AnswerDatastore, load_answers_datastore
from dflash_plugin.draft_policy import DraftPolicy
from dflash_plugin.ngram import NGRAM_MAX, NGRAM_MIN, NgramDrafts, NgramMatch, find_ngram_draft
from dflash_plugin.switches import SwitchError, read

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

PREPARE_PARAMS = ("self", "sampled_token_ids", "requests", "gpu_input_batch",
                  "discard_request_mask")


def ngram_drafts_from_env() -> bool:
    return read("DFLASH_NGRAM_DRAFTS")


def datastore_files_from_env() -> list[Path]:
    """DFLASH_DATASTORE's files (none when unset); a missing one is an error naming it."""
    value = read("DFLASH_DATASTORE") or ""
    files = [Path(part.strip()).expanduser() for part in value.split(",") if part.strip()]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SwitchError(f"DFLASH_DATASTORE: no such file: {', '.join(missing)}")
    return files


def load_datastore(files: list[Path], vocab_size: int | None) -> AnswerDatastore | None:
    """The datastore of these answer files (None for none), checked against the target's
    vocabulary: answers of another tokenizer would only draft tokens that are always wrong."""
    if not files:
        return None
    began = time.perf_counter()
    datastore = load_answers_datastore(files, read("DFLASH_HOME") / "datastores")
    top = int(datastore.corpus.max(initial=-1))
    if vocab_size and top >= vocab_size:
        raise SwitchError(f"DFLASH_DATASTORE: {', '.join(map(str, files))} holds token id {top}, "
                          f"outside this target's vocabulary of {vocab_size}: answers of "
                          "another model")
    logger.info("dflash plugin: retrieval datastore of %d answer tokens from %s (%.1f s)",
                int((datastore.corpus >= 0).sum()), ", ".join(map(str, files)),
                time.perf_counter() - began)
    return datastore


# The compiled step lookup (vllm_ext.ngram_kernel), once start() has loaded numba in this
# process; until then step_matches uses the core's numpy search.
_kernel = None


def start(policy: DraftPolicy, record_requests: bool = False,
          vocab_size: int | None = None) -> NgramDrafts | None:
    """The lookup side of this drafter's policy, with P6 in place; None when switched off or
    when P6's guards refuse it (logged). P6 also goes in with lookup off when
    `record_requests` (the propose hook then still reads the batch's request ids). With
    DFLASH_DATASTORE it also drafts from the datastore of those answers."""
    global _kernel
    lookup = ngram_drafts_from_env()
    files = datastore_files_from_env()
    if files and not lookup:
        logger.warning("dflash plugin: DFLASH_DATASTORE is set but DFLASH_NGRAM_DRAFTS is off: "
                       "retrieved drafts need it; no datastore is loaded")
    if not (lookup or record_requests) or not install_history_hook():
        return None
    if not lookup:
        return None
    from vllm_ext import ngram_kernel

    ngram_kernel.warm_up()
    _kernel = ngram_kernel
    return NgramDrafts(policy.block, datastore=load_datastore(files, vocab_size))


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


def _step_arrays(step_tokens, batch: int):
    """(token_ids [rows, width], lengths [batch], sampled [batch, K + 1], discard [batch], vocab
    or 0) from P6's record, as numpy arrays; None when the record does not fit this step."""
    if step_tokens is None:
        return None
    input_batch, sampled, discard = step_tokens
    token_ids = getattr(input_batch, "token_ids_cpu", None)
    lengths = getattr(input_batch, "num_tokens_no_spec", None)
    if not isinstance(token_ids, np.ndarray) or lengths is None or sampled.shape[0] != batch \
            or len(lengths) < batch:
        return None
    return (token_ids, np.asarray(lengths[:batch], dtype=np.int64),
            sampled.cpu().numpy().astype(np.int64, copy=False),
            discard[:batch].cpu().numpy().astype(np.bool_, copy=False),
            int(getattr(input_batch, "vocab_size", None) or 0))


def _sampled_count(row: np.ndarray, vocab: int) -> int:
    """How many of a row's sampled tokens are real: accepted drafts, then the bonus token
    (-1, or an id past the vocabulary, marks the end)."""
    bad = (row < 0) | (row >= vocab) if vocab else row < 0
    return int(np.argmax(bad)) if bad.any() else row.shape[0]


def histories(step_tokens, batch: int) -> list[np.ndarray | None]:
    """Each request's tokens up to and including the one just sampled (None for a request whose
    token was not sampled this step, e.g. a prefill chunk, or when the record does not fit)."""
    arrays = _step_arrays(step_tokens, batch)
    if arrays is None:
        return [None] * batch
    token_ids, lengths, sampled, discard, vocab = arrays
    out = []
    for i in range(batch):
        if discard[i]:
            out.append(None)
            continue
        row = sampled[i]
        valid = _sampled_count(row, vocab)
        if valid == 0:
            out.append(None)
            continue
        out.append(np.concatenate([token_ids[i, :int(lengths[i])], row[:valid]]))
    return out


def step_tails(step_tokens, batch: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(tails [batch, width], sizes [batch]): the last `width` tokens of each history that
    `histories` would give, right-aligned, and how many of them there are (0: no history)."""
    tails = np.zeros((batch, max(width, 0)), dtype=np.int64)
    sizes = np.zeros(batch, dtype=np.int64)
    arrays = _step_arrays(step_tokens, batch)
    if arrays is None or width < 1:
        return tails, sizes
    token_ids, lengths, sampled, discard, vocab = arrays
    for i in range(batch):
        if discard[i]:
            continue
        row = sampled[i]
        valid = _sampled_count(row, vocab)
        if valid == 0:
            continue
        new = row[max(0, valid - width):valid]
        old_len = min(width - new.shape[0], int(lengths[i]))
        tail = np.concatenate([token_ids[i, int(lengths[i]) - old_len:int(lengths[i])], new])
        tails[i, width - tail.shape[0]:] = tail
        sizes[i] = tail.shape[0]
    return tails, sizes


def step_matches(step_tokens, batch: int, k: int, min_n: int = NGRAM_MIN,
                 max_n: int = NGRAM_MAX) -> list[NgramMatch | None]:
    """find_ngram_draft on each of this step's histories (None: no history or no match), in one
    compiled call once start() has loaded the kernel."""
    if _kernel is None:
        return [None if h is None else find_ngram_draft(h, k, min_n, max_n)
                for h in histories(step_tokens, batch)]
    if not 1 <= min_n <= max_n:
        raise ValueError(f"n-gram lengths need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    arrays = _step_arrays(step_tokens, batch)
    if arrays is None or k < 1:
        return [None] * batch
    ngrams = np.zeros(batch, dtype=np.int64)
    tokens = np.zeros((batch, k), dtype=np.int64)
    _kernel.step_lookup(*arrays, k, min_n, max_n, ngrams, tokens)
    return [NgramMatch(tokens[i], int(n)) if n else None for i, n in enumerate(ngrams.tolist())]
