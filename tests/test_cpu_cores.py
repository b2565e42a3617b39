"""DFLASH_CPU_CORES: which cores `dflash serve` gives a vLLM-CPU engine."""

import pytest

from dflash_cli.serving import flags
from dflash_cli.serving.cpu_cores import BIND_VAR, RESERVED_VAR, core_env
from dflash_plugin.switches import SwitchError


def test_default_binds_every_core_on_small_machines_only():
    for settings in ({}, {"DFLASH_CPU_CORES": "auto"}):
        for cpus in ([0, 1], [3]):
            env, line = core_env(settings, cpus=cpus)
            assert env == {BIND_VAR: ",".join(map(str, cpus)), RESERVED_VAR: "0"}
            assert f"all {len(cpus)} cores" in line and f"auto: {len(cpus)} cores" in line
        env, line = core_env(settings, cpus=[0, 1, 2, 3])
        assert env == {}
        assert "all cores but one" in line and "auto: 4 cores, more than 2" in line
    # an explicit choice wins over the machine's size
    assert core_env({"DFLASH_CPU_CORES": "reserve-one"}, cpus=[0, 1])[0] == {}
    assert core_env({"DFLASH_CPU_CORES": "all"}, cpus=[0, 1, 2, 3])[0][BIND_VAR] == "0,1,2,3"


def test_all_binds_every_core_and_reserves_none():
    env, line = core_env({"DFLASH_CPU_CORES": "all"}, cpus=[0, 1])
    assert env == {BIND_VAR: "0,1", RESERVED_VAR: "0"}
    assert "all 2 cores" in line


def test_all_splits_the_cores_between_tensor_parallel_ranks():
    env, _ = core_env({"DFLASH_CPU_CORES": "all"}, ranks=2, cpus=[0, 1, 2, 3, 5])
    assert env[BIND_VAR] == "0,1|2,3"


def test_more_ranks_than_cores_keeps_vllms_binding():
    env, line = core_env({"DFLASH_CPU_CORES": "all"}, ranks=3, cpus=[0, 1])
    assert env == {} and "3 tensor-parallel ranks" in line


def test_the_callers_own_binding_wins():
    env, line = core_env({"DFLASH_CPU_CORES": "all", BIND_VAR: "1"}, cpus=[0, 1])
    assert env == {} and BIND_VAR in line


def test_a_bad_value_is_refused_with_the_variables_name():
    with pytest.raises(SwitchError, match="DFLASH_CPU_CORES"):
        core_env({"DFLASH_CPU_CORES": "both"}, cpus=[0, 1])


@pytest.fixture
def two_core_cpu_server(monkeypatch):
    """`dflash serve` on vLLM-CPU with cores 0 and 1 and no binding of the caller's own."""
    monkeypatch.setattr(flags, "is_cpu_vllm", lambda: True)
    monkeypatch.setattr("dflash_cli.serving.cpu_cores.usable_cpus", lambda: [0, 1])
    monkeypatch.delenv(BIND_VAR, raising=False)
    monkeypatch.delenv(RESERVED_VAR, raising=False)


def test_serve_passes_the_binding_and_says_which(two_core_cpu_server, capsys):
    opts = flags.ServeOptions(model_path="/tmp/model", speculative_algorithm="NONE",
                              env={"DFLASH_CPU_CORES": "all"})
    launch = flags.vllm_launch(opts)
    assert launch.environ({})[BIND_VAR] == "0,1"
    assert "engine on all 2 cores" in capsys.readouterr().err


def test_serve_binds_plain_and_speculative_servers_alike(two_core_cpu_server, monkeypatch):
    monkeypatch.delenv("DFLASH_CPU_CORES", raising=False)
    for algorithm in ("NONE", "NGRAM", "DFLASH"):
        launch = flags.vllm_launch(flags.ServeOptions(model_path="/tmp/model",
                                                      speculative_algorithm=algorithm,
                                                      speculative_draft_model_path="/tmp/draft",
                                                      speculative_num_draft_tokens=16))
        assert launch.environ({})[BIND_VAR] == "0,1", algorithm
