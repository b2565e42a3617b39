"""Wall time per phase of vLLM's engine step.

Wraps the engine core's and the model runner's methods named in PHASES with a timer. Times are
inclusive (a phase contains the phases it calls), summed per process. Two ways in:
`install()` in the measuring process (`measure_vllm_dflash.py --phases`, which runs the engine
core and the worker there), and `install_on_import()` in processes it does not control (a
server's, through `tools/phase_hook` on PYTHONPATH), which writes each process's totals to files.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import sys
import time
from collections import defaultdict

# phase name -> (module, class, method)
PHASES = {
    "engine.step": ("vllm.v1.engine.core", "EngineCore", "step"),
    "engine.schedule": ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    "engine.update_from_output": ("vllm.v1.core.sched.scheduler", "Scheduler",
                                  "update_from_output"),
    "engine.update_draft_token_ids": ("vllm.v1.core.sched.scheduler", "Scheduler",
                                      "update_draft_token_ids"),
    "runner.execute_model": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                             "execute_model"),
    "runner.update_states": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                             "_update_states"),
    "runner.prepare_inputs": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                              "_prepare_inputs"),
    "runner.attention_metadata": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                                  "_build_attention_metadata"),
    "runner.model_forward": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                             "_model_forward"),
    "runner.sample_tokens": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                             "sample_tokens"),
    "runner.sample": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample"),
    "runner.bookkeeping": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                           "_bookkeeping_sync"),
    "runner.propose": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
                       "propose_draft_token_ids"),
    # inside runner.propose, with this plugin
    "plugin.plain_or_original": ("vllm_ext.plain_steps", None, "_plain_or_original"),
    "plugin.propose_with_policy": ("vllm_ext.patches", None, "_propose_with_policy"),
    "plugin.learn": ("vllm_ext.drafting", "Drafting", "learn"),
    "plugin.plain_rows": ("vllm_ext.patches", None, "plain_rows"),
    "plugin.rows_without_context": ("vllm_ext.drafting", "Drafting", "rows_without_context"),
    "plugin.should_draft": ("dflash_plugin.draft_policy", "DraftPolicy", "should_draft"),
    "plugin.lookup_only": ("vllm_ext.drafting", "Drafting", "lookup_only"),
    "plugin.select": ("vllm_ext.drafting", "Drafting", "select"),
    "plugin.lookup": ("vllm_ext.drafting", "Drafting", "lookup"),
    "plugin.lookup_drafts": ("vllm_ext.drafting", "Drafting", "lookup_drafts"),
    "plugin.store_context_only": ("vllm_ext.patches", None, "_store_context_only"),
    "plugin.set_context_inputs": ("vllm_ext.patches", None, "_set_context_inputs"),
    "plugin.flush_context": ("vllm_ext.drafting", "Drafting", "flush_context"),
}

totals: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)


def _timed(name, method, after=None):
    """`method` adding its wall time to `name`'s total; `after()` runs after each call."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - began
            calls[name] += 1
            if after is not None:
                after()
    return wrapper


def _owner_and_method(module, cls_name, method_name):
    """(class or module, its attribute) of one phase; None where this vLLM lacks it. Module
    functions are looked up by name when called, so wrapping the attribute reaches callers."""
    owner = module if cls_name is None else getattr(module, cls_name, None)
    method = getattr(owner, method_name, None) if owner is not None else None
    return (owner, method) if method is not None else None


def install() -> list[str]:
    """Wrap every phase that exists in the installed vLLM; returns the names wrapped."""
    wrapped = []
    for name, (module, cls_name, method_name) in PHASES.items():
        found = _owner_and_method(importlib.import_module(module), cls_name, method_name)
        if found is None:
            continue
        setattr(found[0], method_name, _timed(name, found[1]))
        wrapped.append(name)
    return wrapped


def snapshot() -> dict[str, tuple[float, int]]:
    return {name: (totals[name], calls[name]) for name in PHASES}


def since(before: dict[str, tuple[float, int]]) -> dict[str, dict[str, float]]:
    """Milliseconds and calls per phase since `before`."""
    now = snapshot()
    return {name: {"ms": round(1000 * (now[name][0] - before[name][0]), 1),
                   "calls": now[name][1] - before[name][1]}
            for name in PHASES if now[name][1] > before[name][1]}


def install_on_import(out_dir: str, every: int = 100):
    """For processes this one does not control (a server's engine core and worker): wrap each
    phase when its module is first imported, and every `every` calls of a step-level phase
    write this process's totals to `out_dir`/<pid>.json. With DFLASH_PHASE_TRACE set, the
    worker also writes one line per model step to `out_dir`/<pid>.steps.jsonl."""
    from importlib.abc import MetaPathFinder

    modules = {module for module, _, _ in PHASES.values()}
    steps = {"engine.step", "runner.execute_model"}
    tracing = bool(os.environ.get("DFLASH_PHASE_TRACE"))
    trace = []  # the worker's trace file, opened at its first step

    def traced(method):
        """runner.execute_model, also writing one line per step: wall time of the call and
        of the step since the previous call, requests, tokens, draft tokens verified."""
        last = [None]

        @functools.wraps(method)
        def wrapper(runner, scheduler_output, *args, **kwargs):
            began = time.perf_counter()
            try:
                return method(runner, scheduler_output, *args, **kwargs)
            finally:
                ended = time.perf_counter()
                drafts = scheduler_output.scheduled_spec_decode_tokens or {}
                if not trace:
                    trace.append(open(os.path.join(out_dir, f"{os.getpid()}.steps.jsonl"), "a"))
                trace[0].write(json.dumps({
                    "t": round(ended, 4), "ms": round(1000 * (ended - began), 2),
                    "since_ms": round(1000 * (began - last[0]), 2) if last[0] else None,
                    "reqs": len(scheduler_output.num_scheduled_tokens),
                    "tokens": scheduler_output.total_num_scheduled_tokens,
                    "drafts": sum(len(d) for d in drafts.values()),
                    "drafting_reqs": sum(1 for d in drafts.values() if d)}) + "\n")
                last[0] = began
        return wrapper

    def dump_every(name):
        def after():
            if calls[name] % every:
                return
            with open(os.path.join(out_dir, f"{os.getpid()}.json"), "w") as f:
                json.dump({"argv": sys.argv[:3], "phases": snapshot()}, f)
            if trace:
                trace[0].flush()
        return after

    def wrap_module(module):
        for name, (mod, cls_name, method_name) in PHASES.items():
            if mod != module.__name__:
                continue
            found = _owner_and_method(module, cls_name, method_name)
            if found is None:
                continue
            cls, method = found
            if tracing and name == "runner.execute_model":
                method = traced(method)
            setattr(cls, method_name,
                    _timed(name, method, dump_every(name) if name in steps else None))

    class Finder(MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname not in modules:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                wrap_module(module)
            spec.loader.exec_module = exec_module
            return spec

    os.makedirs(out_dir, exist_ok=True)
    sys.meta_path.insert(0, Finder())
