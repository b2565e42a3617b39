"""A drafter that does not fit the target stops vLLM at start-up, naming the mismatch.

The engine runs in a child process, as `vllm serve` would: the check fires in the worker while
the drafter is built (before weights, compilation or KV-cache sizing), and what the user sees
is vLLM's start-up failure with our message in its log.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm", reason="needs the vLLM CPU build")
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.engine]

START = textwrap.dedent("""
    import sys
    from vllm import LLM

    if __name__ == "__main__":
        spec = {"method": "dflash", "model": sys.argv[2], "num_speculative_tokens": 15}
        LLM(model=sys.argv[1], speculative_config=spec, dtype="float32", max_model_len=512,
            kv_cache_memory_bytes=1 << 28, enforce_eager=True)
""")


def test_layer_ids_beyond_the_target_fail_at_startup(tmp_path, target_path,
                                                     drafter_with_bad_layers):
    script = tmp_path / "start.py"
    script.write_text(START)
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("VLLM_PLUGINS", None)
    result = subprocess.run([sys.executable, str(script), str(target_path),
                             str(drafter_with_bad_layers)],
                            capture_output=True, text=True, env=env, timeout=900)
    log = result.stdout + result.stderr
    assert result.returncode != 0
    assert "MismatchError: drafter target_layer_ids [1, 40] include [40], but the target has " \
           "only 30 layers (0..29)" in log, log[-3000:]
