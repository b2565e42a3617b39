"""Start-up failures of `dflash serve` are clear: a bad flag before anything starts, and a draft
checkpoint that does not fit the target stops the server with the mismatch named."""

import re
import subprocess
import sys

import pytest
from server_helpers import START_TIMEOUT, ServeProcess, make_random_drafter

from dflash_plugin.serving.server import ServerExited


def test_unknown_speculative_algorithm_fails_before_starting_anything():
    result = subprocess.run([sys.executable, "-m", "dflash_plugin.cli", "serve",
                             "--speculative-algorithm", "MEDUSA"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "invalid choice 'MEDUSA'" in result.stderr
    assert "starting:" not in result.stderr  # no engine was launched


@pytest.mark.vllm
@pytest.mark.slow
def test_drafter_for_another_target_fails_at_startup_naming_the_mismatch(
        tmp_path, target_path, server_logs):
    # Feature layer 40 does not exist in the 30-layer target.
    bad = make_random_drafter(tmp_path / "mismatched-dflash", target_path,
                              target_layer_ids=[1, 8, 14, 20, 40])
    server = ServeProcess(server_logs / "mismatch.log", "--speculative-draft-model-path", str(bad),
                          "--dtype", "float32", "--", "--enforce-eager").start()
    try:
        with pytest.raises(ServerExited) as exited:
            server.wait_ready(START_TIMEOUT)
    finally:
        server.stop()
    assert exited.value.returncode != 0
    output = server.output
    assert re.search(r"target_layer_ids", output, re.I), output[-3000:]
    assert "40" in output
