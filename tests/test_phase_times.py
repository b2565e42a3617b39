"""tools/phase_times.py on a hand-made module (no engine): inclusive times and call counts per
phase, and the import hook that wraps a module when it is first imported."""

import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "phase_times", Path(__file__).parent.parent / "tools" / "phase_times.py")
phase_times = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(phase_times)

MODULE = '''
import time

class Engine:
    def step(self):
        self.inner()
        return "stepped"

    def inner(self):
        time.sleep(0.01)

def helper(x):
    return x + 1
'''


@pytest.fixture()
def fake_phases(tmp_path, monkeypatch):
    name = f"fake_engine_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(phase_times, "PHASES", {
        "engine.step": (name, "Engine", "step"),
        "engine.inner": (name, "Engine", "inner"),
        "fn.helper": (name, None, "helper"),
        "missing": (name, "Nowhere", "step"),
    })
    monkeypatch.setattr(phase_times, "totals", phase_times.defaultdict(float))
    monkeypatch.setattr(phase_times, "calls", phase_times.defaultdict(int))
    yield name
    sys.modules.pop(name, None)


def test_install_times_methods_and_functions_inclusively(fake_phases):
    module = importlib.import_module(fake_phases)
    assert phase_times.install() == ["engine.step", "engine.inner", "fn.helper"]
    before = phase_times.snapshot()
    engine = module.Engine()
    assert engine.step() == "stepped" and engine.step() == "stepped"
    assert module.helper(1) == 2
    spent = phase_times.since(before)
    assert spent["engine.step"]["calls"] == 2 and spent["engine.inner"]["calls"] == 2
    assert spent["fn.helper"]["calls"] == 1
    assert spent["engine.inner"]["ms"] >= 20  # two 10 ms sleeps
    assert spent["engine.step"]["ms"] >= spent["engine.inner"]["ms"]  # inclusive
    assert "missing" not in spent


def test_import_hook_wraps_on_first_import_and_dumps(fake_phases, tmp_path, monkeypatch):
    finders = list(sys.meta_path)
    out = tmp_path / "out"
    phase_times.install_on_import(str(out), every=2)
    try:
        module = importlib.import_module(fake_phases)
        engine = module.Engine()
        engine.step()
        assert not list(out.iterdir())  # no dump before `every` steps
        engine.step()
        dumped = json.loads(next(out.iterdir()).read_text())
        assert dumped["phases"]["engine.step"][1] == 2
        assert dumped["phases"]["engine.inner"][1] == 2
    finally:
        monkeypatch.setattr(sys, "meta_path", finders)


def test_trace_writes_one_line_per_model_step(fake_phases, tmp_path, monkeypatch):
    name = fake_phases
    module_text = (tmp_path / f"{name}.py").read_text() + """

class Runner:
    def execute_model(self, scheduler_output):
        return len(scheduler_output.num_scheduled_tokens)
"""
    (tmp_path / f"{name}.py").write_text(module_text)
    monkeypatch.setitem(phase_times.PHASES, "runner.execute_model", (name, "Runner",
                                                                     "execute_model"))
    monkeypatch.setenv("DFLASH_PHASE_TRACE", "1")
    finders = list(sys.meta_path)
    out = tmp_path / "out"
    phase_times.install_on_import(str(out), every=2)
    try:
        module = importlib.import_module(name)
        from types import SimpleNamespace
        step = SimpleNamespace(num_scheduled_tokens={"a": 1, "b": 4},
                               total_num_scheduled_tokens=5,
                               scheduled_spec_decode_tokens={"a": [], "b": [7, 8, 9]})
        runner = module.Runner()
        assert runner.execute_model(step) == 2 and runner.execute_model(step) == 2
        lines = [json.loads(line) for line in
                 next(out.glob("*.steps.jsonl")).read_text().splitlines()]
        assert [(r["reqs"], r["tokens"], r["drafts"], r["drafting_reqs"]) for r in lines] == [
            (2, 5, 3, 1)] * 2
        assert lines[0]["since_ms"] is None and lines[1]["since_ms"] >= 0
    finally:
        monkeypatch.setattr(sys, "meta_path", finders)
