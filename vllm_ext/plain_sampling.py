"""P4 and P5: requests with `min_p` or `logit_bias` are served without drafts instead of refused.

vLLM 0.32 answers such a request with 400 "not yet supported with speculative decoding" as soon
as any speculative method is configured: its rejection sampler applies neither to the verified
positions, and with speculation the worker builds neither logits processor. A request that gets
no drafts is sampled by vLLM's plain sampler alone (the bonus-token path, P2 or not), which does
apply both once they are built; that request is then decoded exactly as without speculation
(greedy: the same tokens; sampled, seeded: the same draws, since the rejection kernels leave the
generator of a request without drafts alone). Other requests keep drafting.

Ledger
------
P4  Target:  vllm.v1.engine.input_processor.InputProcessor._validate_params (front end).
    Why:     SamplingParams._validate_spec_decode refuses min_p and logit_bias whenever a
             speculative config exists.
    How:     for such a request on an engine this plugin serves them on (`serves_plain_requests`),
             checks the logit_bias ids as vLLM does, then runs the original validation with
             min_p and logit_bias cleared for its duration (every other check unchanged) and puts
             them back. Any other request or engine runs the original unchanged.
P5  Target:  vllm.v1.sample.logits_processor.build_logitsprocs, as the V1 model runner
             (vllm.v1.worker.gpu_model_runner) calls it when it builds its input batch.
    Why:     with a speculative config it builds only the min-tokens processor.
    How:     on such an engine (and without custom processors) it builds vLLM's built-in
             processors (min tokens, logit bias, min-p) plus `PlainSamplingRows`, which tracks the
             batch rows whose request has min_p or logit_bias; P1 (vllm_ext.patches) hands those
             rows no drafts. Any other engine gets the original's processors.
    Scope:   `serves_plain_requests`: method "dflash" with this plugin's drafter class, the V1
             runner, synchronous scheduling (P1 drafts per request only there; the CPU platform
             always uses it), and every guard below passing. Those are facts of the installed
             vLLM and of the config, the same in the front end and in the workers, so a request
             P4 lets through is always served by P5 and P1.
    Guard:   vLLM release series in vllm_ext.plugin.TESTED_VLLM (or the skip-version-check
             override); the parameters of the two targets, of SamplingParams._validate_spec_decode
             / _validate_logit_bias, and of P1's proposer methods. Otherwise nothing is patched
             and vLLM keeps refusing these requests.
    Removal: when vLLM's rejection sampler applies min_p and logit_bias to verified positions.
"""

from __future__ import annotations

import functools
import logging
import sys

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's log handler

MIN_P_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a smaller min_p counts as unset
VALIDATE_PARAMS = ("self", "params", "supported_tasks")
BUILD_LOGITSPROCS_PARAMS = ("vllm_config", "device", "is_pin_memory", "is_pooling_model",
                            "custom_logitsprocs")
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"

_announced: set[str] = set()


def needs_plain_sampling(params) -> bool:
    """Whether vLLM cannot verify drafts for a request with these sampling parameters."""
    return params.min_p > MIN_P_EPS or bool(params.logit_bias)


def guard_problems() -> list[str]:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.sample import logits_processor
    from vllm.v1.spec_decode.dflash import DFlashProposer

    from vllm_ext.guards import hook_problems, signature_problems, unpatched
    from vllm_ext.patches import EXPECTED_PARAMS

    # P4 / P5 guards: the front-end check, the processors' builder and P1's methods.
    return (hook_problems(InputProcessor, {"_validate_params": VALIDATE_PARAMS})
            + signature_problems(SamplingParams, {
                "_validate_spec_decode": ("self", "speculative_config"),
                "_validate_logit_bias": ("self", "model_config")})
            + _function_problems(logits_processor, "build_logitsprocs",
                                 BUILD_LOGITSPROCS_PARAMS, unpatched)
            + signature_problems(DFlashProposer, EXPECTED_PARAMS, unwrap=unpatched))


def _function_problems(module, name, params, unwrap) -> list[str]:
    import inspect

    function = getattr(module, name, None)
    if function is None:
        return [f"{module.__name__}.{name} is missing"]
    found = tuple(inspect.signature(unwrap(function)).parameters)
    return [] if found == params else [
        f"{module.__name__}.{name} has parameters {found}, expected {params}"]


@functools.lru_cache(maxsize=1)
def _guards_pass() -> bool:
    problems = guard_problems()
    if problems:
        logger.warning("dflash plugin: requests with min_p or logit_bias stay refused with "
                       "speculative decoding (%s)", "; ".join(problems))
    return not problems


def serves_plain_requests(vllm_config) -> bool:
    """Whether this plugin serves min_p / logit_bias requests without drafts on this engine."""
    from vllm_ext import plugin

    spec = vllm_config.speculative_config
    if spec is None or spec.method != "dflash" or not plugin._registered:
        return False
    draft = getattr(spec, "draft_model_config", None)
    architectures = getattr(getattr(draft, "hf_config", None), "architectures", None) or ()
    return (plugin.ARCHITECTURE in architectures
            and not vllm_config.scheduler_config.async_scheduling
            and not getattr(vllm_config, "use_v2_model_runner", False)
            and _guards_pass())


def _announce(where: str):
    if where not in _announced:
        _announced.add(where)
        logger.info("dflash plugin: requests with min_p or logit_bias are served without drafts "
                    "(%s)", where)


class PlainSamplingRows:
    """A logits processor that changes nothing: it tracks which rows of the persistent batch
    hold a request with min_p or logit_bias, through the batch updates vLLM gives every
    processor, for P1 to hand them no drafts."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: dict[int, bool] = {}

    @classmethod
    def validate_params(cls, sampling_params):
        return None

    def is_argmax_invariant(self) -> bool:
        return True

    def apply(self, logits):
        return logits

    def update_state(self, batch_update):
        from vllm.v1.sample.logits_processor.builtin import process_dict_updates

        process_dict_updates(self.rows, batch_update,
                             lambda params, _prompt, _output:
                             True if needs_plain_sampling(params) else None)

    def plain_rows(self) -> list[int]:
        return sorted(self.rows)


def plain_rows(sampling_metadata) -> list[int]:
    """Batch rows that must get no drafts this step ([] on engines without P5's processors)."""
    logitsprocs = getattr(sampling_metadata, "logitsprocs", None)
    for processor in getattr(logitsprocs, "argmax_invariant", ()):
        if isinstance(processor, PlainSamplingRows):
            return processor.plain_rows()
    return []


def _lifted_validation(original):
    def _validate_params(self, params, supported_tasks):
        from vllm.sampling_params import SamplingParams

        if not (isinstance(params, SamplingParams) and needs_plain_sampling(params)
                and serves_plain_requests(self.vllm_config)):
            return original(self, params, supported_tasks)
        params._validate_logit_bias(self.model_config)  # P4: the bias check vLLM would run
        min_p, logit_bias = params.min_p, params.logit_bias
        params.min_p, params.logit_bias = 0.0, None
        try:
            result = original(self, params, supported_tasks)
        finally:
            params.min_p, params.logit_bias = min_p, logit_bias
        _announce("front end")
        return result
    return _validate_params


def _all_builtin_processors(original):
    def build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model,
                          custom_logitsprocs=()):
        if is_pooling_model or custom_logitsprocs or not serves_plain_requests(vllm_config):
            return original(vllm_config, device, is_pin_memory, is_pooling_model,
                            custom_logitsprocs)
        from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors

        _announce("worker")
        return LogitsProcessors([ctor(vllm_config, device, is_pin_memory)
                                 for ctor in (*BUILTIN_LOGITS_PROCESSORS, PlainSamplingRows)])
    return build_logitsprocs


def _replace(owner, name, make_replacement):
    """Put make_replacement(original) in place of owner.name once (quietly: the replacement
    logs when it first serves a request)."""
    from vllm_ext.guards import PATCH_MARKER

    original = getattr(owner, name)
    if hasattr(original, PATCH_MARKER):
        return
    replacement = functools.wraps(original)(make_replacement(original))
    setattr(replacement, PATCH_MARKER, original)
    setattr(owner, name, replacement)


def install_plain_sampling() -> bool:
    """Apply P4 and P5 in this process (called by vllm_ext.plugin.register, before vLLM builds
    a model runner); True if they are (now or already) in place. Their replacements act only on
    engines `serves_plain_requests` accepts."""
    if not _guards_pass():
        return False
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.sample import logits_processor

    _replace(InputProcessor, "_validate_params", _lifted_validation)
    _replace(logits_processor, "build_logitsprocs", _all_builtin_processors)
    runner = sys.modules.get(RUNNER_MODULE)  # imported already: it holds its own reference
    if runner is not None and hasattr(runner, "build_logitsprocs"):
        _replace(runner, "build_logitsprocs", _all_builtin_processors)
    return True
