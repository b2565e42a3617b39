"""Which load-aware drafting a worker runs, decided from the VllmConfig its drafter is built
with, and the one start-up line that says so.

- V1 runner, synchronous scheduling (always on vLLM-CPU): the propose hook P1
  (vllm_ext.patches), with the runner-level short cut for steps without drafts P8
  (vllm_ext.plain_steps), the zero-draft sampler short cut P2 (vllm_ext.zero_draft_sampling)
  and, on vLLM-CPU, the expand fix P7 (vllm_ext.cpu_expand).
- V2 runner with `enable_adaptive_verification` in the speculative config: the verification
  budget hook P3 (vllm_ext.v2_adaptive), async scheduling or not.
- Anything else verifies vLLM's full blocks, and the line says why. No hook is installed on a
  runner that does not run it, so no "patched" line names a patch that cannot act.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_plugin.draft_policy import CostModel, PolicyMode

PROPOSE_HOOK = "the propose hook"
ADAPTIVE_VERIFICATION = "adaptive verification"


@dataclass(frozen=True)
class Runtime:
    """What vLLM runs in this worker, as far as the plugin's hooks care."""

    runner: str  # "V1", "V2", or "unknown" (a vLLM without `use_v2_model_runner`)
    async_scheduling: bool
    method: str | None  # the speculative method
    adaptive_verification: bool  # enable_adaptive_verification in the speculative config

    @classmethod
    def of(cls, vllm_config) -> Runtime:
        use_v2 = getattr(vllm_config, "use_v2_model_runner", None)  # the worker's own test
        spec = vllm_config.speculative_config
        return cls(runner="unknown" if use_v2 is None else ("V2" if use_v2 else "V1"),
                   async_scheduling=bool(vllm_config.scheduler_config.async_scheduling),
                   method=getattr(spec, "method", None),
                   adaptive_verification=bool(getattr(spec, "enable_adaptive_verification",
                                                      False)))

    def summary(self) -> str:
        return (f"{self.runner} runner, async scheduling "
                f"{'on' if self.async_scheduling else 'off'}")


@dataclass(frozen=True)
class LoadAware:
    """The outcome: `route` is how load-aware drafting runs (None: it does not), `detail` how,
    or why not."""

    runtime: Runtime
    route: str | None
    detail: str

    @property
    def v1_hooks(self) -> bool:
        """P1 is in place: the drafter needs its per-step drafting state."""
        return self.route == PROPOSE_HOOK

    def line(self) -> str:
        if self.route is None:
            return f"{self.runtime.summary()}: load-aware drafting inactive: {self.detail}"
        return f"{self.runtime.summary()}: load-aware drafting via {self.route} ({self.detail})"


def start(vllm_config, mode: PolicyMode, costs: CostModel, *, sampler_shortcut: bool,
          stats_every: int = 0) -> LoadAware:
    """Install the hooks this worker's runner runs, and say what runs."""
    from vllm_ext.guards import version_problems

    runtime = Runtime.of(vllm_config)
    problems = version_problems()
    if problems:
        return LoadAware(runtime, None, "; ".join(problems))
    if runtime.runner == "V1":
        return _start_v1(runtime, mode, sampler_shortcut)
    if runtime.runner == "V2":
        return _start_v2(runtime, mode, costs, stats_every)
    return LoadAware(runtime, None, "this vLLM does not say which model runner it uses")


def _start_v1(runtime: Runtime, mode: PolicyMode, sampler_shortcut: bool) -> LoadAware:
    from vllm_ext import cpu_expand, patches, plain_steps, zero_draft_sampling

    if runtime.async_scheduling:
        return LoadAware(runtime, None, "the propose hook needs synchronous scheduling "
                                        "(--no-async-scheduling); every draft is verified")
    if not patches.install_propose_patch():
        return LoadAware(runtime, None, "the propose hook's guards refused it (see the "
                                        "warning above)")
    plain_steps.install_plain_steps()  # P8: a short cut only; P1 works without it
    if sampler_shortcut:
        zero_draft_sampling.install_zero_draft_sampling()
    cpu_expand.install_cpu_expand_fix()  # P7: only where vLLM-CPU's fallback gets it wrong
    return LoadAware(runtime, PROPOSE_HOOK, f"policy {mode.value}")


def _start_v2(runtime: Runtime, mode: PolicyMode, costs: CostModel,
              stats_every: int) -> LoadAware:
    from vllm_ext import v2_adaptive

    v2_adaptive.activate(None)
    if runtime.method != "dflash":
        return LoadAware(runtime, None, f"the verification budget hook serves method dflash, "
                                        f"not {runtime.method}")
    if not runtime.adaptive_verification:
        return LoadAware(runtime, None, "V2 verifies every draft unless the speculative config "
                                        "sets enable_adaptive_verification: true")
    if not v2_adaptive.install_budget_hook():
        return LoadAware(runtime, None, "the verification budget hook's guards refused it (see "
                                        "the warning above); vLLM's own budget is used")
    budget = v2_adaptive.VerifyBudget(mode, costs, plugin_prices=_plugin_prices(),
                                      stats_every=stats_every)
    v2_adaptive.activate(budget)
    return LoadAware(runtime, ADAPTIVE_VERIFICATION, budget.describe())


def _plugin_prices() -> bool:
    from dflash_plugin.switches import read
    from vllm_ext.v2_adaptive import names_prices

    return names_prices(read("DFLASH_COST_MODEL") or "")
