"""Start-up failures of `dflash serve` are clear and come before anything starts: a bad flag, and
a draft checkpoint that does not fit the target, with the mismatch named."""

import subprocess
import sys

from server_helpers import make_random_drafter


def test_unknown_speculative_algorithm_fails_before_starting_anything():
    result = subprocess.run([sys.executable, "-m", "dflash_cli.main", "serve",
                             "--speculative-algorithm", "MEDUSA"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "invalid choice 'MEDUSA'" in result.stderr
    assert "starting:" not in result.stderr  # no engine was launched


def test_drafter_for_another_target_fails_before_starting_naming_the_mismatch(
        tmp_path, target_path):
    # Feature layer 40 does not exist in the 30-layer target: refused from the two config.json
    # files, before an engine is launched (tests/vllm/test_startup_mismatch.py covers the same
    # pair given to vLLM directly, which the plugin refuses at start-up).
    bad = make_random_drafter(tmp_path / "mismatched-dflash", target_path,
                              target_layer_ids=[1, 8, 14, 20, 40])
    result = subprocess.run([sys.executable, "-m", "dflash_cli.main", "serve",
                             "--speculative-draft-model-path", str(bad), "--dtype", "float32"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (f"draft model {bad} does not fit target {target_path}: drafter target_layer_ids "
            "[1, 8, 14, 20, 40] include [40], but the target has only 30 layers (0..29)"
            ) in result.stderr
    assert "starting:" not in result.stderr  # no engine was launched
