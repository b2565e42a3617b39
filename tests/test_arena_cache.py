"""The arena cache (dflash_plugin._arena_cache, H1 in docs/engine-ledger.md): blocks go back to
the allocator that made them, a full table hands new blocks to CPython's allocator, and frame-stack
churn stops faulting. Each case runs in its own interpreter, so this process keeps its allocator."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from dflash_plugin import arena_cache

WORKLOAD = textwrap.dedent("""
    import json, resource, sys, threading
    from dflash_plugin import arena_cache

    def rec(n):
        return 0 if n == 0 else rec(n - 1) + 1

    def churn(times):
        # 600 frames reach several 16 KiB frame-stack chunks past the caller's; each return
        # hands them back
        return sum(rec(600) for _ in range(times))

    setting = json.loads(sys.argv[1])
    early = [(i, str(i)) for i in range(300_000)]  # object arenas made before the switch
    if setting["install"]:
        on, why = arena_cache.enable(setting.get("max_blocks"))
        assert on, why
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    assert churn(3000) == 3000 * 600
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start
    results = []
    threads = [threading.Thread(target=lambda: results.append(churn(200))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200 * 600] * 4
    del early  # their arenas go back to CPython's allocator
    late = [(i, str(i)) for i in range(300_000)]
    check = sum(int(s) for _, s in late) == sum(range(300_000))
    del late
    print(json.dumps({"faults": faults, "check": check, "stats": arena_cache.stats()}))
""")


def run(**setting) -> dict:
    done = subprocess.run([sys.executable, "-c", WORKLOAD, json.dumps(setting)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built():
    if arena_cache.stats() is None:
        pytest.fail("dflash_plugin._arena_cache is not built: `make setup` (pip install -e .) "
                    "compiles it with the system C compiler")


def test_blocks_go_back_to_the_allocator_that_made_them(built):
    result = run(install=True)
    stats = result["stats"]
    assert result["check"] and stats["installed"]
    # frame-stack chunks and the late arenas came from malloc and went back to it
    assert stats["made"] >= 3000 and stats["freed"] >= 3000
    assert stats["live"] == stats["made"] - stats["freed"] < 64
    assert stats["passed_back"] > 0  # the early arenas, unmapped by CPython's own allocator
    assert stats["passed_on"] == 0


def test_a_full_table_hands_new_blocks_to_cpythons_allocator(built):
    # Room for 8 live blocks: the 30-odd late arenas overflow it, and the chunks and arenas
    # made past it must be freed by CPython's allocator, the rest by malloc, in any order.
    stats = run(install=True, max_blocks=8)["stats"]
    assert stats["passed_on"] > 0
    assert stats["passed_back"] > stats["passed_on"]  # early arenas too
    assert stats["live"] == stats["made"] - stats["freed"] <= 8


def test_frame_stack_churn_stops_faulting(built):
    plain, cached = run(install=False), run(install=True)
    assert not plain["stats"]["installed"]
    # every crossing maps a fresh chunk and touches it; reused blocks are already mapped
    assert plain["faults"] >= 3000, plain
    assert cached["faults"] * 20 < plain["faults"], (plain, cached)


def test_enable_says_why_when_the_module_is_missing(monkeypatch):
    import dflash_plugin

    monkeypatch.setitem(sys.modules, "dflash_plugin._arena_cache", None)  # import fails
    monkeypatch.delattr(dflash_plugin, "_arena_cache", raising=False)
    on, why = arena_cache.enable()
    assert not on and "C compiler" in why
    assert arena_cache.stats() is None
