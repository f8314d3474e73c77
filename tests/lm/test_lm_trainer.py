"""LanguageModelTrainer on the engine: the seed's example, gradients and training against the float64
reference, exact resume from both checkpoint formats, and the failure semantics."""

import numpy as np
import pytest

import uform
from uform import kernels as K
from uform.lm import LanguageModelConfig, LanguageModelTrainer, state_sha256
from uform.reference import lm_numpy as reference

MULTI = LanguageModelConfig(batch=3, length=12, width=64, heads=8, kv_heads=2, mlp=96, layers=3, vocab_size=256)
EXACT = LanguageModelConfig(batch=2, length=256, width=512, heads=4, kv_heads=2, mlp=1024, layers=1)  # exact products


def initial(shape, seed=0, scale=0.02):
    rng = np.random.default_rng(seed)
    weights = (rng.standard_normal(shape.n_total) * scale).astype(np.float32)
    for entry in LanguageModelTrainer.parameter_registry(shape):  # RMSNorm gains start at one
        if entry["name"].endswith("norm"):
            weights[entry["offset"]:entry["offset"] + entry["size"]] = 1.0
    return weights


def batches(shape, count, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, shape.vocab_size, (shape.batch, shape.length + 1), dtype=np.int32) for _ in range(count)]


def test_seed_example_runs_unchanged():
    import mojolearn

    shape = mojolearn.LanguageModelConfig()
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal(shape.n_total) * 0.02).astype(np.float32)
    trainer = mojolearn.LanguageModelTrainer(weights, data_schedule={"corpus": "demo"})
    ids = rng.integers(0, 256, (shape.batch, shape.length + 1), dtype=np.int32)
    loss = trainer.train_step(ids)["loss"]
    assert abs(loss - np.log(256)) < 0.05
    assert mojolearn.SmallByteLanguageModelTrainer is mojolearn.LanguageModelTrainer
    assert hasattr(mojolearn.lm_corpus, "TokenBatches")


@pytest.mark.parametrize("shape", [LanguageModelConfig(), MULTI, EXACT], ids=["default", "multi", "exact"])
def test_gradients_match_float64_reference(shape):
    """One step's loss and gradients against the float64 numpy reference; at the EXACT shape the blocks' products
    run the exact GEMM (its shape rule)."""
    tokens = shape.batch * shape.length
    assert K.gemm_is_exact(tokens, shape.width, shape.mlp) == (shape == EXACT)
    weights = initial(shape, scale=0.1)
    ids = batches(shape, 1)[0]
    trainer = LanguageModelTrainer(weights, data_schedule={}, shape=shape, resident=False, executor="cpu")
    with K.profile() as products:
        result = trainer.train_step(ids)
    assert ({"gemm_exact", "gemm_bt_exact", "gemm_at_exact"} <= set(products)) == (shape == EXACT)
    ref_loss, ref_grad = reference.loss_and_gradients(weights.astype(np.float64), ids, shape)
    assert abs(result["loss"] - ref_loss) < 1e-5 * ref_loss
    error = np.max(np.abs(result["flat_gradients"] - ref_grad)) / np.max(np.abs(ref_grad))
    # the wider model's float32 sums (attention, the head) err more: 1.4e-5 here, with the fma chain's GEMMs too
    assert error < (3e-5 if shape == EXACT else 5e-6)
    assert set(result["gradients"]) == {e["name"] for e in LanguageModelTrainer.parameter_registry(shape)}


def test_fifty_adamw_steps_track_the_reference():
    shape = LanguageModelConfig()
    weights = initial(shape)
    trainer = LanguageModelTrainer(weights, data_schedule={}, lr=2e-3, executor="cpu")
    p, m, v = weights.astype(np.float64), np.zeros(shape.n_total), np.zeros(shape.n_total)
    text = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 40, np.uint8).astype(np.int32)
    losses, ref_losses = [], []
    for step in range(1, 51):
        start = (step * 37) % (len(text) - 2 * (shape.length + 1))
        ids = np.stack([text[start:start + shape.length + 1], text[start + 5:start + 6 + shape.length]])
        losses.append(trainer.train_step(ids)["loss"])
        ref_loss, grad = reference.loss_and_gradients(p, ids, shape)
        ref_losses.append(ref_loss)
        p, m, v = reference.adamw_step(p, grad, m, v, step, 2e-3, (0.9, 0.999), 1e-8, 0.01)
    assert np.max(np.abs(np.array(losses) - ref_losses)) < 2e-3
    assert losses[-1] < losses[0] - 1.0  # it learns the repeated sentence
    assert np.max(np.abs(trainer.parameters_ - p)) < 1e-4


@pytest.mark.parametrize("fmt", ["json", "binary"])
def test_resume_is_bit_identical(tmp_path, fmt):
    shape = LanguageModelConfig()
    data = batches(shape, 100)
    schedule = {"corpus": "random", "seed": 1}
    straight = LanguageModelTrainer(initial(shape), data_schedule=schedule, executor="cpu")
    for ids in data:
        straight.train_step(ids)
    first = LanguageModelTrainer(initial(shape), data_schedule=schedule, executor="cpu")
    for ids in data[:50]:
        first.train_step(ids)
    path = tmp_path / f"half.{fmt}"
    if fmt == "json":
        first.export_checkpoint(path)
        resumed = LanguageModelTrainer.from_checkpoint(path)
    else:
        digest = first.export_checkpoint_binary(path)
        import hashlib

        assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
        resumed = LanguageModelTrainer.from_checkpoint_binary(path)
    assert resumed.step_ == 50 and resumed.data_schedule == schedule
    for ids in data[50:]:
        resumed.train_step(ids)
    assert state_sha256(resumed.export_state()) == state_sha256(straight.export_state())


def test_tampered_checkpoints_are_refused(tmp_path):
    trainer = LanguageModelTrainer(initial(LanguageModelConfig()), data_schedule={"corpus": "a"}, executor="cpu")
    trainer.train_step(batches(LanguageModelConfig(), 1)[0])
    path = tmp_path / "c.json"
    trainer.export_checkpoint(path)
    encoded = path.read_bytes().replace(b'"corpus":"a"', b'"corpus":"b"')
    with pytest.raises(ValueError, match="digest"):
        LanguageModelTrainer.from_checkpoint_bytes(encoded)
    binary = tmp_path / "c.bin"
    trainer.export_checkpoint_binary(binary)
    binary.write_bytes(binary.read_bytes()[:-7])
    with pytest.raises(ValueError):
        LanguageModelTrainer.from_checkpoint_binary(binary)


def test_ragged_logits_equal_each_row_alone():
    shape = LanguageModelConfig()
    trainer = LanguageModelTrainer(initial(shape, scale=0.1), data_schedule={}, executor="cpu")
    ids = batches(shape, 1)[0][:, :20]
    lengths = [7, 20]
    together = trainer.logits(ids, lengths=lengths)
    for row, length in enumerate(lengths):
        alone = trainer.logits(ids[row:row + 1, :length])[0]
        assert np.array_equal(together[row, :length].view(np.uint32), alone.view(np.uint32))
        assert np.all(together[row, length:].view(np.uint32) == 0)  # +0.0
    assert trainer.next_bytes(ids, lengths=lengths) == [int(np.argmax(together[r, n - 1]))
                                                        for r, n in enumerate(lengths)]


def test_next_bytes_ties_go_to_the_lowest_id():
    shape = LanguageModelConfig()
    weights = np.zeros(shape.n_total, np.float32)  # every logit is zero: a tie across the vocabulary
    trainer = LanguageModelTrainer(weights, data_schedule={}, executor="cpu")
    assert trainer.next_bytes(np.array([[5, 6, 7]], np.int32)) == [0]


@pytest.mark.parametrize("ids,message", [
    (np.zeros((1, 33), np.int32), "length"),
    (np.zeros((1025, 4), np.int32), "batch"),
    (np.full((1, 4), 256, np.int32), "ids must lie"),
    (np.zeros(4, np.int32), "2-D"),
])
def test_logits_limits(ids, message):
    trainer = LanguageModelTrainer(initial(LanguageModelConfig()), data_schedule={}, executor="cpu")
    with pytest.raises(ValueError, match=message):
        trainer.logits(ids)


def test_refused_state_leaves_trainer_untouched():
    shape = LanguageModelConfig()
    trainer = LanguageModelTrainer(initial(shape), data_schedule={}, executor="cpu")
    trainer.train_step(batches(shape, 1)[0])
    before = state_sha256(trainer.export_state())
    bad = trainer.export_state()
    bad["m"] = bad["m"][:-1]
    with pytest.raises(ValueError, match="m must have shape"):
        trainer.load_state_dict(bad)
    assert state_sha256(trainer.export_state()) == before and trainer.step_ == 1


def test_non_finite_step_is_rolled_back():
    shape = LanguageModelConfig()
    weights = initial(shape)
    trainer = LanguageModelTrainer(weights, data_schedule={}, executor="cpu", resident=True)
    state = trainer.export_state()
    state["parameters"][-shape.width * shape.vocab_size:] = 3e38  # the head: every logit overflows float32
    trainer.load_state_dict(state)
    before = state_sha256(trainer.export_state())
    with pytest.raises(RuntimeError, match="rolled back"):
        trainer.train_step(batches(shape, 1)[0])
    assert trainer.step_ == 0 and state_sha256(trainer.export_state()) == before
    with pytest.raises(RuntimeError, match="no step has completed"):
        trainer.export_gradients()


def test_resident_session_lean_results_and_gradients():
    shape = LanguageModelConfig()
    ids = batches(shape, 1)[0]
    resident = LanguageModelTrainer(initial(shape), data_schedule={}, executor="cpu", resident=True)
    stateless = LanguageModelTrainer(initial(shape), data_schedule={}, executor="cpu", resident=False)
    lean = resident.train_step(ids)
    full = stateless.train_step(ids)
    assert "flat_gradients" not in lean and lean["flags"]["loss_finite"]
    assert np.array_equal(resident.export_gradients()["flat_gradients"], full["flat_gradients"])
    assert state_sha256(resident.export_state()) == state_sha256(stateless.export_state())
    resident.close()
    with pytest.raises(RuntimeError, match="no resident session"):
        resident.export_gradients()
    with pytest.raises(ValueError, match="lean"):
        LanguageModelTrainer(initial(shape), data_schedule={}, executor="cpu", resident=False, step_result="lean")


def test_bad_arguments_are_named():
    shape = LanguageModelConfig()
    with pytest.raises(ValueError, match="n_total"):
        LanguageModelTrainer(np.zeros(5, np.float32), data_schedule={})
    with pytest.raises(ValueError, match="n_vocab"):
        LanguageModelTrainer(initial(shape), data_schedule={"n_vocab": 300})
    trainer = LanguageModelTrainer(initial(shape), data_schedule={}, executor="cpu")
    with pytest.raises(ValueError, match="positions"):
        trainer.train_step(np.zeros((2, 10), np.int32))
    assert trainer.step_ == 0


def test_run_metadata_and_attention_report():
    trainer = LanguageModelTrainer(initial(LanguageModelConfig()), data_schedule={"corpus": "x"}, executor="cpu",
                                   resident=True)
    assert trainer.attention_stage_report() is None  # no session opened yet
    trainer.train_step(batches(LanguageModelConfig(), 1)[0])
    meta = trainer.run_metadata()
    assert meta["numeric_mode"] == "identical" and meta["engine"]["variant"] == uform.ENGINE_VARIANT
    assert meta["completed_steps"] == 1 and meta["data_schedule"] == {"corpus": "x"}
    assert trainer.attention_stage_report()["total_bytes"] > 0


def test_lost_device_context_blocks_every_call_until_load_state_dict(monkeypatch):
    shape = LanguageModelConfig()
    trainer = LanguageModelTrainer(initial(shape), data_schedule={}, executor="cpu", resident=True)
    ids = batches(shape, 2)
    trainer.train_step(ids[0])
    saved = trainer.export_state()
    from uform.lm.model import DeviceModel

    def broken(self, inputs):
        raise uform.kernels.EngineError("cpu: kernel gemm failed: simulated loss of the device context")

    monkeypatch.setattr(DeviceModel, "forward", broken)
    monkeypatch.setattr(uform.engine.Plan, "run", lambda plan: broken(plan, None))  # the step's replay
    with pytest.raises(RuntimeError, match="session is lost"):
        trainer.train_step(ids[1])
    monkeypatch.undo()
    for call in (lambda: trainer.train_step(ids[1]), lambda: trainer.evaluate(ids[1]), trainer.export_state,
                 lambda: trainer.logits(ids[1][:, :4])):
        with pytest.raises(RuntimeError, match="lost"):
            call()
    trainer.load_state_dict(saved)
    assert trainer.train_step(ids[1])["step"] == 2


def test_an_executor_of_several_devices_is_refused_not_cut_to_its_first(tmp_path):
    shape = LanguageModelConfig()
    several = uform.Executor.for_ram(2)
    with pytest.raises(uform.UFormError, match="executor: .* has 2 devices; the language model trains on one") as error:
        LanguageModelTrainer(initial(shape), data_schedule={}, executor=several)
    assert error.value.code == uform.ErrorCode.UNSUPPORTED
    LanguageModelTrainer(initial(shape), data_schedule={}, executor="cpu").export_checkpoint(tmp_path / "lm.json")
    with pytest.raises(uform.UFormError, match="has 2 devices"):
        LanguageModelTrainer.from_checkpoint(tmp_path / "lm.json", executor=several)
