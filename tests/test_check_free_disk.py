"""scripts/check_free_disk.sh: setup refuses at once when the disk cannot hold the environments."""
import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_free_disk.sh"


def _run(*pairs, **env):
    return subprocess.run(["bash", str(SCRIPT), *pairs], capture_output=True, text=True,
                          env={**os.environ, "DFLASH_SKIP_DISK_CHECK": "", **env})


def _free_gb(path):
    return shutil.disk_usage(path).free // 2**30


def test_refuses_when_missing_environments_need_more_than_is_free(tmp_path):
    too_much = _free_gb(tmp_path) + 10
    result = _run(f"{tmp_path}/a:{too_much // 2}", f"{tmp_path}/b:{too_much - too_much // 2}")
    assert result.returncode == 1
    assert f"{too_much} GB needed" in result.stderr
    assert f"{tmp_path}/a" in result.stderr and f"{tmp_path}/b" in result.stderr


def test_passes_when_the_space_is_there_or_the_environment_exists(tmp_path):
    assert _run(f"{tmp_path}/small:1").returncode == 0
    # An environment already set up needs nothing more, however large its estimate.
    (tmp_path / "made" / "bin").mkdir(parents=True)
    python = tmp_path / "made" / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    assert _run(f"{tmp_path}/made:{_free_gb(tmp_path) + 100}").returncode == 0


def test_skip_variable_installs_anyway(tmp_path):
    huge = _free_gb(tmp_path) + 100
    assert _run(f"{tmp_path}/x:{huge}", DFLASH_SKIP_DISK_CHECK="1").returncode == 0
