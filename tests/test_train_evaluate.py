"""`dflash train --stages evaluate` on a drafter folder given with --eval-draft (here the shipped
one) and a prompts file given with --eval-prompts, on the real float32 target: the report has
each prompt's tau, outputs equal plain decoding's, and bad evaluation flags are refused."""

import json
from pathlib import Path

import pytest
import torch

import dflash_cli.main as cli
from dflash_plugin.defaults import default_drafter_path
from dflash_plugin.train import prompts as prompt_set

pytestmark = pytest.mark.slow

HELD_OUT = Path(__file__).resolve().parents[1] / "train_data/smollm2-135m/eval_prompts.jsonl"


@pytest.fixture()
def shared_target(monkeypatch, smollm_f32):
    """Reuse the session's float32 target instead of loading it again."""
    import dflash_plugin.target

    monkeypatch.setattr(dflash_plugin.target, "load_target",
                        lambda path=None, dtype=torch.bfloat16: smollm_f32)


def evaluate(workdir, *flags) -> int:
    return cli.main(["train", "--workdir", str(workdir), "--stages", "evaluate", *flags])


def test_evaluate_scores_a_drafter_folder_on_a_prompts_file(tmp_path, shared_target, capsys):
    # Two held-out prompts of different categories (extraction is the drafter's easiest).
    by_category = {}
    for prompt in prompt_set.read_jsonl(HELD_OUT):
        by_category.setdefault(prompt.category, prompt)
    chosen = [by_category["extraction"], by_category["chat"]]
    prompts_file = tmp_path / "prompts.jsonl"
    prompt_set.write_jsonl(prompts_file, chosen)

    code = evaluate(tmp_path / "work", "--eval-draft", str(default_drafter_path()),
                    "--eval-prompts", str(prompts_file), "--eval-temperatures", "0",
                    "--eval-max-new-tokens", "24")
    assert code == 0
    report = json.loads((tmp_path / "work" / "eval.json").read_text())
    capsys.readouterr()

    assert set(report) == {"max_new_tokens", "num_prompts", "T=0.0"}  # no T=1 asked for
    row = report["T=0.0"]
    assert [p["category"] for p in row["per_prompt"]] == ["extraction", "chat"]
    assert all(p["identical"] for p in row["per_prompt"]) and row["identical_to_plain"] == "2/2"
    assert all(1 <= p["new_tokens"] <= 24 for p in row["per_prompt"])  # to a stop or the cap
    taus = [p["tau"] for p in row["per_prompt"]]
    assert row["tau_per_category"] == pytest.approx({"chat": taus[1], "extraction": taus[0]},
                                                    abs=1e-3)
    assert row["tau"] == pytest.approx(sum(taus) / 2, abs=1e-3)
    # The trained drafter gets drafts accepted where a block is mostly copied text.
    assert taus[0] > 2.0


def test_evaluate_refuses_missing_prompts_and_bad_temperatures(tmp_path, capsys):
    code = evaluate(tmp_path / "work", "--eval-draft", str(default_drafter_path()))
    assert code == 2
    assert "no held-out prompts at" in capsys.readouterr().err

    with pytest.raises(SystemExit) as exit_info:
        evaluate(tmp_path / "work", "--eval-temperatures", "hot")
    assert exit_info.value.code == 2
    assert "expected a comma list of temperatures" in capsys.readouterr().err

    bad_devices = [("tpu", "choose cpu or a CUDA device"),
                   ("gpu:x", "--device 'gpu:x': choose cpu")]
    if not torch.cuda.is_available():
        bad_devices.append(("cuda", "no CUDA device is available here"))
    for device, message in bad_devices:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["train", "--workdir", str(tmp_path / "work"), "--stages", "train",
                      "--device", device])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, device

    for layers in ("3,1", "0,0", "a", "-1,2", ""):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["train", "--workdir", str(tmp_path / "work"), "--stages", "train",
                      f"--keep-layers={layers}"])
        assert exit_info.value.code == 2
        assert "expected distinct ascending layer indices" in capsys.readouterr().err, layers
