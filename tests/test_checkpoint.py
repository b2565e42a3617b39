"""Drafter checkpoints: round trip, the published config format, and clear errors for broken
folders."""

import json

import pytest
import torch
from core_helpers import make_drafter
from safetensors.torch import load_file, save_file

from dflash_plugin.checkpoint import WEIGHTS_NAME, load_drafter, save_drafter
from dflash_plugin.errors import CheckpointError
from dflash_plugin.generate import SpecDecoder

MASK = 15


@pytest.fixture()
def drafter(tiny_target):
    return make_drafter(tiny_target, block_size=8, mask_token_id=MASK, seed=3)


@pytest.fixture()
def saved(drafter, tmp_path):
    path = tmp_path / "drafter"
    save_drafter(drafter, path, dtype=torch.float32)
    return path


def drafts_of(target, drafter, seed=0):
    """One draft call on random target features: the proposed tokens and the hidden states."""
    gen = torch.Generator().manual_seed(seed)
    width = len(drafter.fields.target_layer_ids) * target.config.hidden_size
    features = torch.randn(1, 6, width, generator=gen)
    decoder = SpecDecoder(target, drafter)
    with torch.inference_mode():
        tokens = decoder.draft(4, 6, drafter.fuse_context(features), drafter.new_cache(), 8)
        hidden = drafter(decoder.embed(torch.tensor([[4] + [MASK] * 7])),
                         drafter.fuse_context(features), torch.arange(6, 14)[None],
                         torch.arange(6)[None])
    return tokens.tolist(), hidden


def test_round_trip_float32_identical_tensors_and_drafts(tiny_target, drafter, saved):
    loaded = load_drafter(saved, dtype=torch.float32)
    original, again = drafter.state_dict(), loaded.state_dict()
    assert original.keys() == again.keys()
    for name in original:
        assert torch.equal(original[name], again[name]), name
    tokens_a, hidden_a = drafts_of(tiny_target, drafter)
    tokens_b, hidden_b = drafts_of(tiny_target, loaded)
    assert tokens_a == tokens_b
    assert torch.equal(hidden_a, hidden_b)


def test_round_trip_bfloat16(drafter, tmp_path):
    save_drafter(drafter, tmp_path / "bf16")  # the default, like the released drafters
    loaded = load_drafter(tmp_path / "bf16", dtype=torch.bfloat16)
    stored = load_file(str(tmp_path / "bf16" / WEIGHTS_NAME))
    assert all(t.dtype == torch.bfloat16 for t in stored.values())
    for name, tensor in drafter.state_dict().items():
        if not name.startswith("rotary_emb."):
            assert torch.equal(tensor.to(torch.bfloat16), loaded.state_dict()[name]), name


def test_saved_config_has_published_fields(drafter, saved):
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert config["block_size"] == 8
    assert config["num_target_layers"] == 4
    assert config["dflash_config"] == {"mask_token_id": MASK,
                                       "target_layer_ids": list(drafter.fields.target_layer_ids)}
    assert config["tie_word_embeddings"] is False
    # weights: the published names, no embedding or LM head of its own
    names = set(load_file(str(saved / WEIGHTS_NAME)))
    layers = config["num_hidden_layers"]
    assert len(names) == 11 * layers + 3
    assert {"fc.weight", "hidden_norm.weight", "norm.weight",
            "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight"} <= names
    assert not any("embed" in n or "lm_head" in n or "rotary" in n for n in names)


# ---- broken folders -------------------------------------------------------------------------

def expect_error(path, *fragments):
    with pytest.raises(CheckpointError) as info:
        load_drafter(path, dtype=torch.float32)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_folder(tmp_path):
    expect_error(tmp_path / "nope", "does not exist")


def test_missing_safetensors(saved):
    (saved / WEIGHTS_NAME).unlink()
    expect_error(saved, "no *.safetensors")


def test_garbage_safetensors(saved):
    (saved / WEIGHTS_NAME).write_bytes(b"\x00garbage, not a safetensors file" * 10)
    expect_error(saved, "corrupt", WEIGHTS_NAME)


def test_truncated_safetensors(saved):
    data = (saved / WEIGHTS_NAME).read_bytes()
    (saved / WEIGHTS_NAME).write_bytes(data[: len(data) // 2])
    expect_error(saved, "corrupt", WEIGHTS_NAME)


def test_huge_header_length_safetensors(saved):
    (saved / WEIGHTS_NAME).write_bytes((2**62).to_bytes(8, "little") + b"{}")
    expect_error(saved, "corrupt")


def test_missing_shard_from_index(saved):
    (saved / f"{WEIGHTS_NAME}.index.json").write_text(json.dumps(
        {"weight_map": {"fc.weight": "model-00001-of-00002.safetensors"}}))
    expect_error(saved, "model-00001-of-00002.safetensors", "missing")


def test_missing_tensor(saved):
    state = load_file(str(saved / WEIGHTS_NAME))
    del state["layers.1.mlp.up_proj.weight"]
    save_file(state, str(saved / WEIGHTS_NAME))
    expect_error(saved, "missing", "layers.1.mlp.up_proj.weight")


def test_unexpected_tensor(saved):
    state = load_file(str(saved / WEIGHTS_NAME))
    state["layers.7.mlp.up_proj.weight"] = torch.zeros(2)
    save_file(state, str(saved / WEIGHTS_NAME))
    expect_error(saved, "unexpected", "layers.7.mlp.up_proj.weight")


def test_wrong_shape_tensor(saved):
    state = load_file(str(saved / WEIGHTS_NAME))
    state["fc.weight"] = torch.zeros(64, 100)
    save_file(state, str(saved / WEIGHTS_NAME))
    expect_error(saved, "fc.weight", "(64, 100)", "(64, 128)")


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def test_missing_config(saved):
    (saved / "config.json").unlink()
    expect_error(saved, "no config.json")


def test_config_not_json(saved):
    (saved / "config.json").write_text("{not json")
    expect_error(saved, "not valid JSON")


def test_config_wrong_model_type(saved):
    edit_config(saved, model_type="llama")
    expect_error(saved, "model_type", "'llama'")


def test_config_without_dflash_fields(saved):
    edit_config(saved, dflash_config=None)
    expect_error(saved, "dflash_config")
    edit_config(saved, dflash_config={"mask_token_id": 3})
    expect_error(saved, "target_layer_ids")


def test_config_without_block_size_or_layers(saved):
    edit_config(saved, block_size=None)
    expect_error(saved, "block_size")
    edit_config(saved, block_size=8, num_target_layers=None)
    expect_error(saved, "num_target_layers")


def test_config_bad_values(saved):
    edit_config(saved, block_size=1)
    expect_error(saved, "block_size must be >= 2")
    edit_config(saved, block_size=8, dflash_config={"mask_token_id": -1, "target_layer_ids": [1]})
    expect_error(saved, "mask_token_id")


def test_config_wrong_types(saved):
    edit_config(saved, hidden_size="64")
    expect_error(saved, "not a valid drafter config", "hidden_size")
    edit_config(saved, hidden_size=64, block_size="eight")
    expect_error(saved, "not a valid drafter config", "eight")
    (saved / "config.json").write_text("[1, 2]")
    expect_error(saved, "JSON list, not an object")


def test_config_shape_disagrees_with_weights(saved):
    edit_config(saved, intermediate_size=256)
    expect_error(saved, "mlp.", "shape", "config.json implies")


# ---- a config written like the released Qwen3-8B-DFlash-b16 one -----------------------------

def published_style_folder(path, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96, layers=5,
                           vocab=128):
    """config.json as released (top-level rope_theta, no rope_parameters; dflash_spec.md 1.2 and
    5.2) with tiny sizes, and 58 hand-named tensors."""
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": 16,
        "bos_token_id": 151643 % vocab,
        "eos_token_id": 151645 % vocab,
        "dflash_config": {"mask_token_id": vocab - 1, "target_layer_ids": [1, 9, 17, 25, 33]},
        "dtype": "bfloat16",
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "layer_types": ["full_attention"] * layers,
        "max_position_embeddings": 40960,
        "max_window_layers": layers,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "num_target_layers": 36,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    state = {"fc.weight": rand(hidden, 5 * hidden), "hidden_norm.weight": rand(hidden),
             "norm.weight": rand(hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        state |= {
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": rand(head_dim),
            p + "self_attn.k_norm.weight": rand(head_dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
            p + "input_layernorm.weight": rand(hidden),
            p + "post_attention_layernorm.weight": rand(hidden),
        }
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
    return state


def test_published_style_config_loads(tmp_path):
    path = tmp_path / "Qwen3-8B-DFlash-b16-tiny"
    state = published_style_folder(path)
    assert len(state) == 58
    drafter = load_drafter(path, dtype=torch.bfloat16)
    fields = drafter.fields
    assert (fields.block_size, fields.target_layer_ids, fields.mask_token_id,
            fields.num_target_layers, fields.target_hidden_size) == (
                16, (1, 9, 17, 25, 33), 127, 36, 64)
    assert len(drafter.layers) == 5 and drafter.lm_head is None
    loaded = drafter.state_dict()
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name
    # RoPE uses the top-level rope_theta of 1e6, with float32 frequencies in a bf16 model
    expected = 1.0 / (1e6 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    assert drafter.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.allclose(drafter.rotary_emb.inv_freq, expected, rtol=1e-6)


def test_rope_frequencies_stay_float32_when_cast(drafter):
    before = drafter.rotary_emb.inv_freq.clone()
    cast = drafter.to(torch.bfloat16)
    assert cast.fc.weight.dtype == torch.bfloat16
    assert cast.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(cast.rotary_emb.inv_freq, before)
