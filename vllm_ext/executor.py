"""An executor that brings the draft token ids back with the sampled tokens: one round trip to
the worker per decoding step instead of two.

With synchronous scheduling (always on vLLM's CPU platform) a speculative engine core asks the
worker for each step's drafts in a separate RPC after the step (`EngineCore.post_step` ->
`take_draft_token_ids`). On a small CPU that round trip is not free: the engine core and the
worker hand the step back and forth through a shared-memory queue whose readers spin, on the
same cores that run the model. `DraftIdsWithOutputExecutor` asks for both in the `sample_tokens`
RPC (a function run on the worker: sample, then take the drafts, as the two RPCs would, back to
back) and answers the engine core's later `take_draft_token_ids` from what came back.

It is vLLM's multiprocessing executor otherwise, chosen through vLLM's own extension point
(`--distributed-executor-backend vllm_ext.executor.DraftIdsWithOutputExecutor`; `dflash serve`
passes it for DFLASH on vLLM). It falls back to the separate RPC whenever the bundled answer
could differ: asynchronous scheduling, no speculative config, a non-blocking call (batch queue),
KV / encoder-cache connectors (their aggregators expect a bare ModelRunnerOutput).
"""

from __future__ import annotations

import logging

from vllm.v1.executor.multiproc_executor import MultiprocExecutor

from vllm_ext.guards import signature_problems, version_problems

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

_NOTHING = object()  # no bundled drafts waiting (distinct from None: "the worker had none")


# S1: the parent methods this class overrides or calls, with the parameters it passes.
EXPECTED_PARAMS = {
    "_init_executor": ("self",),
    "execute_model": ("self", "scheduler_output", "non_block"),
    "sample_tokens": ("self", "grammar_output", "non_block"),
    "take_draft_token_ids": ("self",),
    "collective_rpc": ("self", "method", "timeout", "args", "kwargs", "non_block",
                       "unique_reply_rank", "kv_output_aggregator", "ec_output_aggregator"),
}


def guard_problems(parent=MultiprocExecutor) -> list[str]:
    """S1's guard: why bundling would be unsafe with this vLLM (empty: safe)."""
    return version_problems() + signature_problems(parent, EXPECTED_PARAMS)


def bundles_drafts(vllm_config) -> bool:
    """Only synchronous speculative decoding asks the worker for drafts after each step."""
    return (vllm_config.speculative_config is not None
            and not vllm_config.scheduler_config.async_scheduling)


def sample_and_take_drafts(worker, grammar_output):
    """Runs on the worker: the two calls the engine core would make, in the same order."""
    output = worker.sample_tokens(grammar_output)
    return output, worker.take_draft_token_ids()


# S1 (docs/engine-ledger.md): vLLM's multiprocessing executor, two of its RPCs bundled.
class DraftIdsWithOutputExecutor(MultiprocExecutor):
    def _init_executor(self) -> None:
        super()._init_executor()
        self._bundled_drafts = _NOTHING
        self.bundles_drafts = bundles_drafts(self.vllm_config)
        problems = guard_problems() if self.bundles_drafts else []
        if problems:
            self.bundles_drafts = False
            logger.warning("dflash plugin: the executor asks for draft token ids separately, "
                           "as vLLM's does (%s)", "; ".join(problems))
        else:
            logger.info("dflash plugin: executor %s draft token ids with the sampled tokens",
                        "returns" if self.bundles_drafts else
                        "does not return (no speculation, or asynchronous scheduling)")

    def execute_model(self, scheduler_output, non_block: bool = False):
        self._bundled_drafts = _NOTHING  # a new step: drafts of an earlier one are stale
        return super().execute_model(scheduler_output, non_block=non_block)

    def sample_tokens(self, grammar_output, non_block: bool = False):
        # Connectors' aggregators are set up after the executor and expect a bare output.
        if (not self.bundles_drafts or non_block
                or getattr(self, "kv_output_aggregator", None) is not None
                or getattr(self, "ec_output_aggregator", None) is not None):
            return super().sample_tokens(grammar_output, non_block=non_block)
        output, drafts = self.collective_rpc(
            sample_and_take_drafts, args=(grammar_output,), unique_reply_rank=self.output_rank)
        self._bundled_drafts = drafts
        return output

    def take_draft_token_ids(self):
        drafts, self._bundled_drafts = self._bundled_drafts, _NOTHING
        if drafts is _NOTHING:
            return super().take_draft_token_ids()
        return drafts
