"""The numeric mode of a run (docs/numerics.md): chosen per run, recorded in checkpoints, refused when unknown.

On the CPU, fast mode runs the identical kernels, so a fast run there gives identical mode's bits; what differs
is what the run records. The GPU side of fast mode is tests/test_gpu_fast.py.
"""

import numpy as np
import pytest

import uform
from uform.lm import LanguageModelConfig, LanguageModelTrainer
from uform.errors import ErrorCode, UFormError

TEXTS = ["a small red panda", "red pandas eat bamboo", "the capital of france", "paris is in france"]
SHAPE = LanguageModelConfig(batch=2, length=16, width=32, heads=4, kv_heads=2, mlp=64, layers=2)


def encoder(numerics=None, resume=None):
    return uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=1, hidden=128, objective=uform.Objective.JOINT, resume=resume,
        batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4, max_columns_per_row=32),
        schedule=uform.Schedule(steps=10, learning_rate=2e-3, warmup_steps=1), seed=3, numerics=numerics)


def train_encoder(trainer, steps=2):
    for _ in range(steps):
        trainer.step([uform.Modality.TEXT] * 4, TEXTS, relations=uform.Relations(attract=([0, 1, 2, 3, 4], [1, 0, 3, 2])))
    return trainer


def lm(numerics=None):
    weights = (np.random.default_rng(5).standard_normal(SHAPE.n_total) * 0.05).astype(np.float32)
    return LanguageModelTrainer(weights, data_schedule={}, shape=SHAPE, executor="cpu", resident=True,
                                numerics=numerics)


def lm_batches(count=3):
    rng = np.random.default_rng(9)
    return [rng.integers(0, 256, (SHAPE.batch, SHAPE.length + 1), dtype=np.int32) for _ in range(count)]


def test_encoder_fast_on_the_cpu_is_identical_and_recorded(tmp_path):
    fast, identical = train_encoder(encoder("fast")), train_encoder(encoder())
    assert (fast.numerics, identical.numerics) == ("fast", "identical")
    fast.save(tmp_path / "fast.safetensors")
    identical.save(tmp_path / "identical.safetensors")
    fast_meta, fast_tensors = uform.training.checkpoint.read_tensors(tmp_path / "fast.safetensors", optimizer=True)
    _, identical_tensors = uform.training.checkpoint.read_tensors(tmp_path / "identical.safetensors", optimizer=True)
    assert all(np.array_equal(fast_tensors[name], identical_tensors[name]) for name in identical_tensors)
    assert fast_meta["numerics"] == "fast"
    from safetensors import safe_open

    with safe_open(tmp_path / "identical.safetensors", "numpy") as file:
        assert "numerics" not in file.metadata()  # identical runs write what they always wrote
    assert encoder(resume=tmp_path / "fast.safetensors").numerics == "fast"  # a resume keeps its mode
    assert encoder("identical", resume=tmp_path / "fast.safetensors").numerics == "identical"
    assert uform.Encoder.load(tmp_path / "fast.safetensors", "cpu")._trainer.numerics == "fast"


def test_language_model_fast_on_the_cpu_is_identical_and_recorded(tmp_path):
    fast, identical = lm("fast"), lm()
    for ids in lm_batches():
        assert fast.train_step(ids)["loss"] == identical.train_step(ids)["loss"]
    assert np.array_equal(fast.parameters_, identical.parameters_)
    assert fast.run_metadata()["numeric_mode"] == "fast" and identical.run_metadata()["numeric_mode"] == "identical"
    fast.export_checkpoint(tmp_path / "fast.json")
    identical.export_checkpoint(tmp_path / "identical.json")
    assert fast.export_state()["metadata"] == {"numerics": "fast"} and identical.export_state()["metadata"] == {}
    assert LanguageModelTrainer.from_checkpoint(tmp_path / "fast.json", executor="cpu").run_metadata()[
        "numeric_mode"] == "fast"
    switched = LanguageModelTrainer.from_checkpoint(tmp_path / "fast.json", executor="cpu", numerics="identical")
    assert switched.run_metadata()["numeric_mode"] == "identical" and switched.export_state()["metadata"] == {}
    identical.load_state_dict(fast.export_state())
    assert identical.run_metadata()["numeric_mode"] == "fast"


def test_process_mode_is_the_default_of_new_runs():
    assert uform.numeric_mode() == "identical"
    uform.set_numeric_mode("fast")
    try:
        assert lm().run_metadata()["numeric_mode"] == "fast"
        assert encoder().numerics == "fast"
    finally:
        uform.set_numeric_mode("identical")


@pytest.mark.parametrize("mode", ["turbo", "", 1, "FAST"])
def test_unknown_modes_are_refused_naming_them(mode):
    with pytest.raises(UFormError, match="numeric mode") as refused:
        encoder(mode)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    with pytest.raises(UFormError, match="numeric mode"):
        lm(mode)
    with pytest.raises(UFormError, match="numeric mode"):
        uform.set_numeric_mode(mode)
    assert uform.numeric_mode() == "identical"


def test_a_state_of_an_unknown_mode_leaves_the_trainer_unchanged():
    trainer = lm()
    trainer.train_step(lm_batches(1)[0])
    before = trainer.export_state()
    state = trainer.export_state()
    state["metadata"] = {"numerics": "turbo"}
    with pytest.raises(UFormError, match="turbo"):
        trainer.load_state_dict(state)
    after = trainer.export_state()
    assert after["metadata"] == {} and np.array_equal(after["parameters"], before["parameters"])
    assert trainer.run_metadata()["numeric_mode"] == "identical"


def test_fast_mode_on_a_gpu_without_cublas_is_refused_naming_it(monkeypatch):
    """Fast mode's GEMMs need cuBLAS: where it cannot be loaded, a GPU run is refused with UNSUPPORTED at init."""
    from uform import _loader, executor

    class GpuExecutor:
        is_gpu = True

    def missing():
        raise OSError("libcublas.so.13: not found")

    monkeypatch.setattr(_loader, "load_cublas", missing)
    with pytest.raises(UFormError, match="cuBLAS.*libcublas.so.13") as refused:
        executor.run_numerics("fast", GpuExecutor())
    assert refused.value.code == ErrorCode.UNSUPPORTED
    assert executor.run_numerics("identical", GpuExecutor()) == "identical"  # identical mode needs no cuBLAS
