"""Which cores a vLLM-CPU server computes on (DFLASH_CPU_CORES).

vLLM-CPU binds the model's OpenMP threads to all cores but one, which it leaves to the API
server and the engine-core loop (reserve-one). `all` binds every core to the model
(VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_NUM_OF_RESERVED_CPU=0) and lets the front end share them.
`auto`, the default, binds every core on machines of up to two cores: on each 2-core CPU
measured (a Xeon with AMX, Zen 4 and Zen 5 EPYCs, a Xeon without bf16; docs/benchmarks.md)
plain decoding ran 1.06-1.54x faster that way and the plugin 0.96-1.39x. Larger machines, where
the reserved core is a smaller share, keep vLLM's binding: not measured there."""

from __future__ import annotations

import os
from collections.abc import Mapping

from dflash_plugin.switches import read

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED_VAR = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


EVERY_CORE_UP_TO = 2  # `auto` binds every core on machines with at most this many


def core_env(env: Mapping[str, str], ranks: int = 1,
             cpus: list[int] | None = None) -> tuple[dict[str, str], str]:
    """(the variables to give the server, a line saying which cores its engine uses). The
    caller's own VLLM_CPU_OMP_THREADS_BIND / VLLM_CPU_NUM_OF_RESERVED_CPU win."""
    if BIND_VAR in env or RESERVED_VAR in env:
        return {}, f"engine cores as {BIND_VAR} / {RESERVED_VAR} set them"
    cpus = usable_cpus() if cpus is None else cpus
    choice = why = read("DFLASH_CPU_CORES", env)
    if choice == "auto":
        small = len(cpus) <= EVERY_CORE_UP_TO
        choice = "all" if small else "reserve-one"
        why = f"auto: {len(cpus)} cores, " + ("measured faster on every core" if small
                                              else f"more than {EVERY_CORE_UP_TO}")
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
