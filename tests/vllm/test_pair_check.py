"""Config-level draft/target pair checks (the rules vLLM's start-up applies)."""

from dataclasses import replace

import pytest

from dflash_plugin.errors import MismatchError
from dflash_plugin.pair_check import (DrafterShape, TargetShape, check_pair_shapes, drafter_shape,
                                       target_shape)

TARGET = TargetShape(num_layers=30, hidden_size=576, vocab_size=49152)
DRAFTER = DrafterShape(target_layer_ids=(1, 8, 14, 20, 27), mask_token_id=3, hidden_size=576,
                       vocab_size=49152, target_hidden_size=576, num_target_layers=30)


def test_a_fitting_pair_passes():
    check_pair_shapes(TARGET, DRAFTER)
    check_pair_shapes(TARGET, replace(DRAFTER, num_target_layers=None))


@pytest.mark.parametrize("change, message", [
    (dict(target_layer_ids=(1, 40)), r"target_layer_ids \[1, 40\] include \[40\].*only 30 layers"),
    (dict(num_target_layers=32), "trained for a target with 32 layers, the target has 30"),
    (dict(target_hidden_size=1024), "expects target hidden size 1024, the target has 576"),
    (dict(hidden_size=1024, target_hidden_size=576), "hidden size 1024 differs from the target's 576"),
    (dict(vocab_size=151936), "vocab size 151936 differs from the target's 49152"),
    (dict(mask_token_id=49152), "mask_token_id 49152 is outside"),
    (dict(mask_token_id=-1), "mask_token_id -1 is outside"),
])
def test_mismatches_are_named(change, message):
    with pytest.raises(MismatchError, match=message):
        check_pair_shapes(TARGET, replace(DRAFTER, **change))


def test_shapes_read_from_config_json_dicts():
    published = {"hidden_size": 576, "vocab_size": 49152, "num_target_layers": 30,
                 "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 8, 14, 20, 27]}}
    assert drafter_shape(published) == DRAFTER
    top_level = {"hidden_size": 576, "vocab_size": 49152, "mask_token_id": 3,
                 "dflash_config": {"target_layer_ids": [1, 40]}, "target_hidden_size": 1024}
    assert drafter_shape(top_level) == replace(DRAFTER, target_layer_ids=(1, 40),
                                               target_hidden_size=1024, num_target_layers=None)
    assert drafter_shape({"hidden_size": 576, "vocab_size": 49152}).mask_token_id == -1
    llama = {"num_hidden_layers": 30, "hidden_size": 576, "vocab_size": 49152}
    assert target_shape(llama) == TARGET
    assert target_shape({"model_type": "llava", "text_config": llama}) == TARGET
    assert target_shape({"model_type": "unknown"}) is None
