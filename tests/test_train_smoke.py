"""A few training steps on a handful of real target sequences: the loss falls, the checkpoint
reloads in the published format, and a re-run resumes from it. CI never trains for real."""

import json

import pytest
import torch

from dflash_plugin.checkpoint import load_drafter
from dflash_plugin.prompt_io import encode_user_turn
from dflash_plugin.train.feature_store import FeatureStore, OnlineFeatures, build_feature_store
from dflash_plugin.train.trainer import TrainConfig, Trainer

PAIRS = [
    ("Name three primary colors.", "The three primary colors are red, blue and yellow."),
    ("What is the capital of France?", "The capital of France is Paris, a city on the Seine."),
    ("Count from one to ten.", "One, two, three, four, five, six, seven, eight, nine, ten."),
    ("Give me a fruit.", "An apple is a sweet fruit that grows on trees in many countries."),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory, smollm_bf16):
    model, tokenizer = smollm_bf16
    folder = tmp_path_factory.mktemp("train")
    with (folder / "responses.jsonl").open("w") as f:
        for i, (prompt, answer) in enumerate(PAIRS):
            ids = encode_user_turn(tokenizer, prompt)
            f.write(json.dumps({"id": f"s{i}", "category": "chat", "prompt": prompt,
                                "prompt_ids": ids,
                                "response_ids": tokenizer(answer)["input_ids"] + [2]}) + "\n")
    build_feature_store(model, folder / "responses.jsonl", folder / "features", [1, 8, 14, 20, 27])
    return folder


def _config(store, out, **overrides):
    base = dict(store=str(store / "features"), out_dir=str(out), num_draft_layers=1, block_size=8,
                mask_token_id=16, epochs=30, anchors_per_seq=8, seqs_per_step=2, lr=2e-3,
                save_every=10, draft_vocab_size=2048)
    return TrainConfig(**{**base, **overrides})


def test_feature_store_holds_every_sequence(store, smollm_bf16):
    features = FeatureStore(store / "features")
    assert len(features.sequences) == len(PAIRS)
    seq = features.sequences[0]
    assert features.features(seq).shape == (seq.length, 5 * 576)
    assert features.features(seq).dtype == torch.bfloat16


def test_stored_features_are_the_target_layer_outputs(store, smollm_bf16):
    """The store's pass stops after the deepest captured layer: what it kept must still be
    exactly those layers' outputs of a whole forward pass."""
    model, _ = smollm_bf16
    features = FeatureStore(store / "features")
    seq = features.sequences[1]
    with torch.inference_mode():
        hidden = model(torch.tensor([seq.input_ids]), output_hidden_states=True).hidden_states
    expected = torch.cat([hidden[i + 1][0] for i in (1, 8, 14, 20, 27)], dim=-1)
    assert torch.equal(features.features(seq), expected.to(torch.bfloat16))


def test_online_features_train_exactly_like_the_store(store, tmp_path, smollm_bf16):
    model, _ = smollm_bf16
    stored = FeatureStore(store / "features")
    online = OnlineFeatures(model, store / "responses.jsonl", [1, 8, 14, 20, 27])
    assert [s.input_ids for s in online.sequences] == [s.input_ids for s in stored.sequences]
    for a, b in zip(online.sequences, stored.sequences):
        assert torch.equal(online.features(a), stored.features(b))
    from_store = Trainer(_config(store, tmp_path / "store", max_steps=3), model)
    from_store.run()
    from_online = Trainer(_config(store, tmp_path / "online", max_steps=3), model, online)
    from_online.run()
    rows = [[json.loads(line)["loss"] for line in (tmp_path / run / "metrics.jsonl").open()]
            for run in ("store", "online")]
    assert rows[0] == rows[1] and len(rows[0]) == 3
    assert torch.equal(from_store.drafter.fc.weight, from_online.drafter.fc.weight)


def test_loss_falls_and_checkpoint_reloads_and_resumes(store, tmp_path, smollm_bf16):
    model, _ = smollm_bf16
    trainer = Trainer(_config(store, tmp_path, max_steps=30), model)
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    first = sum(r["loss"] for r in rows[:5]) / 5
    last = sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    drafter = load_drafter(tmp_path / "checkpoint", dtype=torch.float32)
    for name, tensor in trainer.drafter.state_dict().items():
        assert torch.equal(tensor, drafter.state_dict()[name]), name
    resumed = Trainer(_config(store, tmp_path, max_steps=40), model)
    assert resumed.step == 30
    resumed.run()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 40


def test_continue_from_a_checkpoint_and_export_with_the_full_vocabulary(store, tmp_path,
                                                                        smollm_bf16):
    from dflash_plugin.train.export import with_full_vocabulary

    model, _ = smollm_bf16
    first = Trainer(_config(store, tmp_path / "a", max_steps=3), model)
    first.run()
    with pytest.raises(ValueError, match="block_size 8 \\(wanted 4\\)"):
        Trainer(_config(store, tmp_path / "bad", block_size=4,
                        init_from=str(tmp_path / "a" / "checkpoint")), model)
    again = Trainer(_config(store, tmp_path / "b", max_steps=2,
                            init_from=str(tmp_path / "a" / "checkpoint")), model)
    assert again.step == 0
    assert torch.equal(again.drafter.fc.weight, first.drafter.fc.weight)

    reduced = load_drafter(tmp_path / "a" / "checkpoint", dtype=torch.float32)
    head = model.get_output_embeddings().weight.data.float()
    full = with_full_vocabulary(reduced, head)
    assert full.lm_head is None and full.fields.draft_vocab_size is None
    hidden = torch.randn(5, 576)
    draft_ids = reduced.to_target_ids(torch.arange(reduced.d2t.numel()))
    target_head = torch.nn.Linear(576, head.shape[0], bias=False)
    target_head.weight.data = head
    full_logits = full.draft_logits(hidden, target_head)
    assert torch.allclose(reduced.draft_logits(hidden, None), full_logits[:, draft_ids], atol=1e-4)
    reduced.lm_head.weight.data[0] += 1.0  # a head that was trained is not the target's
    with pytest.raises(ValueError, match="not a copy"):
        with_full_vocabulary(reduced, head)


def test_continue_from_a_full_vocabulary_export_trains_with_the_reduced_head(store, tmp_path,
                                                                             smollm_bf16):
    from dflash_plugin.draft_vocab import read_draft_vocab
    from dflash_plugin.train.export import export_drafter

    model, _ = smollm_bf16
    first = Trainer(_config(store, tmp_path / "a", max_steps=2), model)
    first.run()
    head = model.get_output_embeddings().weight.data.float()
    exported = export_drafter(first.drafter, head, tmp_path / "export", dtype=torch.float32)
    assert exported.lm_head is None
    trained_ids = first.drafter.to_target_ids(torch.arange(first.drafter.d2t.numel()))
    assert torch.equal(read_draft_vocab(tmp_path / "export", head.shape[0]), trained_ids)
    again = Trainer(_config(store, tmp_path / "b", max_steps=1,
                            init_from=str(tmp_path / "export")), model)
    assert again.drafter.lm_head is not None
    assert torch.equal(again.drafter.d2t, first.drafter.d2t)
    assert torch.equal(again.drafter.lm_head.weight, first.drafter.lm_head.weight)
    assert not again.drafter.lm_head.weight.requires_grad
    assert torch.equal(again.drafter.layers[0].mlp.up_proj.weight,
                       first.drafter.layers[0].mlp.up_proj.weight)
    again.run()


def test_deepened_drafter_drafts_exactly_like_the_shallow_one(smollm_bf16):
    from dflash_plugin.train.deepen import deepen_drafter
    from core_helpers import make_drafter

    model, _ = smollm_bf16
    shallow = make_drafter(model, num_draft_layers=2, dtype=torch.float32)
    for layer in shallow.layers:  # trained-looking weights, not the init's near-zero ones
        for param in layer.parameters():
            param.data.normal_(0, 0.05)
    deeper = deepen_drafter(shallow, 4).eval()
    assert len(deeper.layers) == 4 and deeper.config.num_hidden_layers == 4
    assert len(deeper.config.layer_types) == 4
    torch.manual_seed(1)
    block = torch.randn(1, 16, 576)
    context = shallow.fuse_context(torch.randn(1, 12, shallow.fc.in_features))
    args = (block, context, torch.arange(12, 28)[None], torch.arange(12)[None])
    assert torch.equal(shallow(*args), deeper(*args))
    # The new layers are real layers (copies of the last one), not frozen zeros: training moves them.
    assert torch.equal(deeper.layers[3].self_attn.q_proj.weight,
                       shallow.layers[1].self_attn.q_proj.weight)
    assert deeper.layers[3].self_attn.o_proj.weight.requires_grad
    with pytest.raises(ValueError, match="cannot deepen a 2-layer drafter to 1"):
        deepen_drafter(shallow, 1)


def test_continue_from_a_shallower_checkpoint_grows_it(store, tmp_path, smollm_bf16):
    model, _ = smollm_bf16
    first = Trainer(_config(store, tmp_path / "a", max_steps=2), model)
    first.run()
    grown = Trainer(_config(store, tmp_path / "b", max_steps=3, num_draft_layers=2,
                            init_from=str(tmp_path / "a" / "checkpoint")), model)
    assert len(grown.drafter.layers) == 2
    assert not grown.drafter.layers[1].mlp.down_proj.weight.any()
    grown.run()
    assert grown.drafter.layers[1].mlp.down_proj.weight.any()  # it learnt, away from identity
    assert len(load_drafter(tmp_path / "b" / "checkpoint").layers) == 2


def test_shallower_drafter_drops_only_the_layers_it_is_told_to(smollm_bf16):
    from dflash_plugin.train.deepen import (deepen_drafter, default_kept_layers,
                                            shallower_drafter)
    from core_helpers import make_drafter

    model, _ = smollm_bf16
    base = make_drafter(model, num_draft_layers=2, dtype=torch.float32)
    for layer in base.layers:
        for param in layer.parameters():
            param.data.normal_(0, 0.05)
    # Layers 2 and 3 of the grown drafter are identities: dropping them drafts as before,
    # dropping a trained one does not.
    grown = deepen_drafter(base, 4)
    torch.manual_seed(1)
    block = torch.randn(1, 16, 576)
    context = base.fuse_context(torch.randn(1, 12, base.fc.in_features))
    args = (block, context, torch.arange(12, 28)[None], torch.arange(12)[None])
    for keep in ([0, 1], [0, 1, 3]):
        cut = shallower_drafter(grown, keep).eval()
        assert len(cut.layers) == len(keep) == cut.config.num_hidden_layers
        assert len(cut.config.layer_types) == len(keep)
        assert torch.equal(base.eval()(*args), cut(*args))
    assert not torch.allclose(base(*args), shallower_drafter(grown, [1, 2]).eval()(*args))
    assert default_kept_layers(8, 4) == [0, 1, 2, 7]
    assert default_kept_layers(8, 2) == [0, 7] and default_kept_layers(8, 1) == [7]
    with pytest.raises(ValueError, match="cannot keep 9"):
        default_kept_layers(8, 9)
    for bad in ([], [1, 0], [0, 4], [0, 0]):
        with pytest.raises(ValueError, match="layers to keep"):
            shallower_drafter(grown, bad)


def test_continue_from_a_deeper_checkpoint_keeps_its_layers(store, tmp_path, smollm_bf16):
    model, _ = smollm_bf16
    Trainer(_config(store, tmp_path / "a", max_steps=2, num_draft_layers=3), model).run()
    deep = load_drafter(tmp_path / "a" / "checkpoint", dtype=torch.float32)
    cut = Trainer(_config(store, tmp_path / "b", max_steps=3, num_draft_layers=2,
                          init_from=str(tmp_path / "a" / "checkpoint"), keep_layers=[1, 2]), model)
    assert len(cut.drafter.layers) == 2
    assert torch.equal(cut.drafter.layers[0].mlp.up_proj.weight, deep.layers[1].mlp.up_proj.weight)
    cut.run()
    assert len(load_drafter(tmp_path / "b" / "checkpoint").layers) == 2
    with pytest.raises(ValueError, match="holds 1 layers, not num_draft_layers 2"):
        Trainer(_config(store, tmp_path / "c", num_draft_layers=2, keep_layers=[0],
                        init_from=str(tmp_path / "a" / "checkpoint")), model)
    with pytest.raises(ValueError, match="not more than num_draft_layers 3"):
        Trainer(_config(store, tmp_path / "d", num_draft_layers=3, keep_layers=[0, 1, 2],
                        init_from=str(tmp_path / "a" / "checkpoint")), model)
    with pytest.raises(ValueError, match="none given"):
        Trainer(_config(store, tmp_path / "e", keep_layers=[0]), model)


def test_widened_drafter_drafts_exactly_like_the_narrow_one(smollm_bf16):
    from dflash_plugin.config import make_config
    from dflash_plugin.drafter import DFlashDraftModel
    from dflash_plugin.train.widen import widen_drafter

    model, _ = smollm_bf16
    torch.manual_seed(0)
    narrow = DFlashDraftModel(make_config(model.config, num_draft_layers=1, block_size=16,
                                          mask_token_id=16, target_layer_ids=[1, 8, 14, 20, 27]))
    narrow.fc.weight.data.normal_(0, 0.05)  # trained-looking, so misplaced columns would show
    wide = widen_drafter(narrow, [0, 1, 8, 14, 20, 27, 29]).eval()
    assert list(wide.fields.target_layer_ids) == [0, 1, 8, 14, 20, 27, 29]
    assert wide.config.dflash_config["target_layer_ids"] == [0, 1, 8, 14, 20, 27, 29]
    torch.manual_seed(1)
    kept = torch.randn(12, 5, 576)  # the five layers both read, at 12 context positions
    added = torch.randn(12, 2, 576)  # layers 0 and 29, which only the wide drafter reads
    wide_features = torch.cat([added[:, :1], kept, added[:, 1:]], dim=1).reshape(1, 12, -1)
    block = torch.randn(1, 16, 576)
    positions = (torch.arange(12, 28)[None], torch.arange(12)[None])
    expected = narrow.eval()(block, narrow.fuse_context(kept.reshape(1, 12, -1)), *positions)
    got = wide(block, wide.fuse_context(wide_features), *positions)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert wide.fc.weight.requires_grad
    with pytest.raises(ValueError, match=r"cannot drop target layers \[27\]"):
        widen_drafter(narrow, [1, 8, 14, 20, 29])


def test_continue_on_more_target_layers_widens_the_checkpoint(store, tmp_path, smollm_bf16):
    model, _ = smollm_bf16
    first = Trainer(_config(store, tmp_path / "a", max_steps=2), model)
    first.run()
    wider_store = OnlineFeatures(model, store / "responses.jsonl", [1, 8, 14, 20, 27, 29])
    grown = Trainer(_config(store, tmp_path / "b", max_steps=3,
                            init_from=str(tmp_path / "a" / "checkpoint")), model, wider_store)
    added = grown.drafter.fc.weight[:, 5 * 576:]
    assert list(grown.drafter.fields.target_layer_ids) == [1, 8, 14, 20, 27, 29]
    assert not added.any()
    grown.run()
    assert grown.drafter.fc.weight[:, 5 * 576:].any()  # it learnt to read layer 29
    again = load_drafter(tmp_path / "b" / "checkpoint")
    assert list(again.fields.target_layer_ids) == [1, 8, 14, 20, 27, 29]


def test_distillation_teacher_is_the_targets_next_token_distribution(store, smollm_bf16):
    from dflash_plugin.train.trainer import teacher_log_probs
    from core_helpers import make_drafter

    model, _ = smollm_bf16
    online = OnlineFeatures(model, store / "responses.jsonl", [1, 8, 14, 20, 27])
    seq = online.sequences[2]
    features, final_hidden = online.features_and_final_hidden(seq)
    assert torch.equal(features, online.features(seq))
    drafter = make_drafter(model, num_draft_layers=1, dtype=torch.float32)
    positions = torch.arange(seq.prompt_len, seq.length)
    teacher = teacher_log_probs(drafter, final_hidden, positions, model.get_output_embeddings())
    with torch.inference_mode():
        logits = model(torch.tensor([seq.input_ids])).logits[0].float()
    expected = logits[positions - 1].log_softmax(-1)
    assert torch.allclose(teacher.exp(), expected.exp(), atol=0.02)
    # The greedy answer the target wrote is what its distribution puts first.
    agree = (teacher.argmax(-1) == expected.argmax(-1)).float().mean()
    assert agree > 0.9, agree


def test_distillation_needs_online_features_and_trains(store, tmp_path, smollm_f32):
    # The float32 target (as dflash train loads it where bf16 is not native): distillation runs
    # the whole target per sequence, 36 passes here, which take minutes in software bf16.
    model, _ = smollm_f32
    with pytest.raises(ValueError, match="--online-features"):
        Trainer(_config(store, tmp_path / "stored", distill_weight=0.5), model)
    online = OnlineFeatures(model, store / "responses.jsonl", [1, 8, 14, 20, 27])
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        Trainer(_config(store, tmp_path / "bad", distill_weight=1.5), model, online)
    trainer = Trainer(_config(store, tmp_path / "kd", max_steps=30, distill_weight=0.5), model,
                      online)
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "kd" / "metrics.jsonl").open()]
    first = sum(r["loss"] for r in rows[:5]) / 5
    last = sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    # The KL term changes the gradient: the same run without it ends elsewhere.
    plain = Trainer(_config(store, tmp_path / "ce", max_steps=3), model, online)
    plain.run()
    mixed = Trainer(_config(store, tmp_path / "kd3", max_steps=3, distill_weight=0.5), model,
                    online)
    mixed.run()
    assert not torch.equal(plain.drafter.fc.weight, mixed.drafter.fc.weight)


def test_training_precision_follows_the_cpu(monkeypatch):
    from dflash_plugin import cpu_features
    from dflash_plugin.train.trainer import TrainingPrecision

    for native, expected in [(True, "bfloat16"), (None, "bfloat16"), (False, "float32")]:
        monkeypatch.setattr(cpu_features, "native_bf16", lambda native=native: native)
        assert TrainingPrecision().name == expected
    assert TrainingPrecision("bfloat16").name == "bfloat16"  # asked for: the CPU does not matter
    with pytest.raises(ValueError, match="compute dtype 'float16'"):
        TrainingPrecision("float16")
    monkeypatch.setattr(cpu_features, "native_bf16", lambda: False)
    assert TrainingPrecision(device="cuda").name == "bfloat16"  # a GPU does not ask the CPU
    assert TrainingPrecision(device="cuda").device_type == "cuda"


@pytest.mark.parametrize("vocab, steps", [(2048, 12), (None, 2)])
def test_float32_training_of_a_bf16_target_learns_like_bf16(store, tmp_path, smollm_bf16, vocab,
                                                            steps):
    """The float32 path casts the bf16 stored features, embedding and (full-vocabulary) LM head
    up: the same steps as bf16 autocast, with losses that differ only by rounding. (Two steps
    with the full 49K head: its bf16 run is slow where bf16 is emulated.)"""
    model, _ = smollm_bf16
    losses = {}
    for dtype in ("bfloat16", "float32"):
        trainer = Trainer(_config(store, tmp_path / dtype, max_steps=steps,
                                  draft_vocab_size=vocab, compute_dtype=dtype), model)
        trainer.run()
        losses[dtype] = [json.loads(line)["loss"]
                         for line in (tmp_path / dtype / "metrics.jsonl").open()]
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16  # target left as it was
    bf16, fp32 = losses["bfloat16"], losses["float32"]
    assert bf16 != fp32  # the dtype took effect
    assert abs(bf16[0] - fp32[0]) < 0.05 * bf16[0]  # same model, same batch: rounding only
    if steps > 3:
        assert sum(fp32[-3:]) < 0.9 * sum(fp32[:3])  # and float32 learns


class _Clock:
    """A clock that moves 0.5 s at every reading, so the time budget is deterministic."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += 0.5
        return self.now


def test_time_budget_fits_the_schedule_and_survives_a_resume(store, tmp_path, smollm_bf16,
                                                            monkeypatch):
    from dflash_plugin.train import trainer as trainer_module
    from dflash_plugin.train.trainer import CALIBRATION_STEPS, lr_at

    model, _ = smollm_bf16
    monkeypatch.setattr(trainer_module, "time", _Clock())
    # 30 epochs would be 60 steps; the budget at ~0.5 s a step allows about 30
    trainer = Trainer(_config(store, tmp_path, time_budget_s=15.0, save_every=5), model)
    assert trainer.total_steps == 60
    trainer.run()
    assert CALIBRATION_STEPS < trainer.total_steps < 40
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert len(rows) == trainer.step == trainer.total_steps  # it stopped where the schedule ends
    assert rows[-1]["lr"] == pytest.approx(lr_at(trainer.step - 1, trainer.total_steps,
                                                 trainer.cfg))
    assert rows[-1]["lr"] < 0.05 * trainer.cfg.lr
    resumed = Trainer(_config(store, tmp_path), model)  # the refitted schedule is kept
    assert (resumed.step, resumed.total_steps) == (trainer.step, trainer.total_steps)
    with pytest.raises(ValueError, match="time budget"):
        Trainer(_config(store, tmp_path / "bad", time_budget_s=0.0), model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_training_on_cuda_matches_the_cpu(store, tmp_path, smollm_bf16):
    """The drafter and the online target on the GPU: the same sequences, anchors and losses as
    on the CPU up to bf16 kernel rounding, and the loss falls there too."""
    import copy

    model, _ = smollm_bf16
    losses = {}
    for device in ("cpu", "cuda"):
        target = copy.deepcopy(model).to(device)
        online = OnlineFeatures(target, store / "responses.jsonl", [1, 8, 14, 20, 27])
        trainer = Trainer(_config(store, tmp_path / device, max_steps=30, device=device),
                          target, online)
        trainer.run()
        assert trainer.drafter.fc.weight.device.type == device
        losses[device] = [json.loads(line)["loss"]
                          for line in (tmp_path / device / "metrics.jsonl").open()]
    cpu, cuda = losses["cpu"], losses["cuda"]
    assert abs(cpu[0] - cuda[0]) < 0.02 * cpu[0]
    assert sum(cuda[-5:]) < 0.8 * sum(cuda[:5])
    reloaded = load_drafter(tmp_path / "cuda" / "checkpoint", dtype=torch.float32)
    assert reloaded.fc.weight.device.type == "cpu"


def test_lookup_hints_reach_the_training_blocks_and_mark_the_export(store, tmp_path,
                                                                    smollm_bf16, monkeypatch):
    import dflash_plugin.train.trainer as trainer_module
    from dflash_plugin.lookup_hints import uses_lookup_hints
    from dflash_plugin.train.export import export_drafter

    model, _ = smollm_bf16
    with pytest.raises(ValueError, match="lookup_hints"):
        Trainer(_config(store, tmp_path / "bad", lookup_hints=1.5), model)
    written = []
    fill = trainer_module.fill_batch_hints

    def spy(block_ids, *args, **kwargs):
        out = fill(block_ids, *args, **kwargs)
        written.append(int((out != block_ids).sum()))
        return out

    monkeypatch.setattr(trainer_module, "fill_batch_hints", spy)
    trainer = Trainer(_config(store, tmp_path / "h", max_steps=3, lookup_hints=1.0,
                              anchors_per_seq=64), model)
    trainer.run()
    assert len(written) == 6 and sum(written) > 0  # "One, two, three, ..." repeats ", "
    assert uses_lookup_hints(load_drafter(tmp_path / "h" / "checkpoint", dtype=torch.float32))
    head = model.get_output_embeddings().weight.data.float()
    export_drafter(trainer.drafter, head, tmp_path / "export")
    assert uses_lookup_hints(load_drafter(tmp_path / "export", dtype=torch.float32))
    plain = Trainer(_config(store, tmp_path / "p", max_steps=1), model)
    assert not uses_lookup_hints(plain.drafter)
