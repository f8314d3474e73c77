"""Fast mode on the GPU: bf16 tensor-core GEMMs against a float64 reference, and runs that repeat their bits.

Runs only where the engine has a GPU (tools/gpu-check runs it on the H200). Fast mode's contract
(docs/numerics.md): bf16 operands, fp32 accumulation and outputs, the same bits on every run on one
GPU model; the CPU runs the identical kernels instead.
"""

import numpy as np
import pytest

import uform
from uform import kernels as K
from uform.lm import LanguageModelConfig, LanguageModelTrainer
from uform.reference import lm_numpy as lm_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(uform.gpu_count() == 0, reason="needs a GPU engine and a GPU")]


def bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest bfloat16 (ties to even), as float64: the operands fast mode multiplies."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return rounded.view(np.float32).astype(np.float64)


@pytest.fixture(scope="module")
def gpu():
    uform.executor.run_numerics("fast", uform.Executor.for_vram([0]))
    return uform.Device.gpu(0)


@pytest.mark.parametrize("form", ["ab", "atb", "abt"])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (37, 29, 53), (256, 192, 1024), (130, 70, 3000)])
def test_fast_gemm_is_the_fp32_sum_of_bf16_products(gpu, form, accumulate, m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k)
    ta, tb = form == "atb", form == "abt"
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    ab, bb, cb = gpu.put(a), gpu.put(b), gpu.put(c0)
    K.gemm(cb, ab, bb, m, n, k, transpose_a=ta, transpose_b=tb, accumulate=accumulate, fast=True)
    got = cb.numpy().astype(np.float64)
    left, right = bf16(a), bf16(b)
    left, right = (left.T if ta else left), (right.T if tb else right)
    exact = left @ right + (c0 if accumulate else 0.0)
    # fp32 accumulation of k products: each output within a few k·2⁻²⁴ of Σ|a||b| (+|c0|).
    scale = np.abs(left) @ np.abs(right) + (np.abs(c0) if accumulate else 0.0)
    assert np.all(np.abs(got - exact) <= 4 * max(k, 16) * 2.0**-24 * scale + 1e-30)
    # ... and far from the fp32 product of the unrounded inputs only by the operands' bf16 rounding.
    plain = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    assert np.max(np.abs(got - (plain + (c0 if accumulate else 0.0))) / (scale + 1e-30)) < 2.0**-7


@pytest.mark.parametrize("form", ["ab", "atb", "abt"])
def test_fast_gemm_on_given_bf16_copies_gives_the_same_bits(gpu, form):
    """The stack hands the products bf16 copies made once (kernels.cast_bf16): the same bits as rounding here."""
    rng = np.random.default_rng(11)
    m, n, k = 300, 200, 500
    ta, tb = form == "atb", form == "abt"
    a = gpu.put(rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32))
    b = gpu.put(rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32))
    a16, b16 = gpu.empty(a.shape, np.uint16), gpu.empty(b.shape, np.uint16)
    K.cast_bf16(a16, a)
    K.cast_bf16(b16, b)
    here, given = gpu.empty((m, n)), gpu.empty((m, n))
    K.gemm(here, a, b, m, n, k, transpose_a=ta, transpose_b=tb, fast=True)
    K.gemm(given, a, b, m, n, k, transpose_a=ta, transpose_b=tb, fast=True, a16=a16, b16=b16)
    assert np.array_equal(here.numpy().view(np.uint32), given.numpy().view(np.uint32))
    # an operand that exists only as its copy (the stack's a, m, s and du in fast mode) is passed as None
    alone = gpu.empty((m, n))
    K.gemm(alone, None, None, m, n, k, transpose_a=ta, transpose_b=tb, fast=True, a16=a16, b16=b16)
    assert np.array_equal(here.numpy().view(np.uint32), alone.numpy().view(np.uint32))
    with pytest.raises(ValueError, match="missing"):
        K.gemm(alone, None, b, m, n, k, transpose_a=ta, transpose_b=tb, fast=True)


def test_fast_gemm_repeats_its_bits(gpu):
    rng = np.random.default_rng(7)
    m, n, k = 1024, 768, 3072
    a, b = gpu.put(rng.standard_normal((m, k)).astype(np.float32)), gpu.put(rng.standard_normal((k, n)).astype(np.float32))
    first, second = gpu.empty((m, n)), gpu.empty((m, n))
    K.gemm(first, a, b, m, n, k, fast=True)
    K.gemm(second, a, b, m, n, k, fast=True)
    assert np.array_equal(first.numpy().view(np.uint32), second.numpy().view(np.uint32))


def lm_weights(shape, seed=0, scale=0.1):
    weights = (np.random.default_rng(seed).standard_normal(shape.n_total) * scale).astype(np.float32)
    for entry in LanguageModelTrainer.parameter_registry(shape):  # RMSNorm gains start at one
        if entry["name"].endswith("norm"):
            weights[entry["offset"]:entry["offset"] + entry["size"]] = 1.0
    return weights


SHAPES = [LanguageModelConfig(), LanguageModelConfig(batch=4, length=64, width=128, heads=4, kv_heads=2, mlp=256,
                                                      layers=2)]


@pytest.mark.parametrize("shape", SHAPES, ids=["default", "wider"])
def test_language_model_fast_gradients_are_within_bf16_tolerance_of_float64(shape):
    weights = lm_weights(shape)
    ids = np.random.default_rng(1).integers(0, 256, (shape.batch, shape.length + 1), dtype=np.int32)
    trainer = LanguageModelTrainer(weights, data_schedule={}, shape=shape, resident=False, executor="gpu:0",
                                   numerics="fast")
    result = trainer.train_step(ids)
    ref_loss, ref_grad = lm_reference.loss_and_gradients(weights.astype(np.float64), ids, shape)
    # bf16 operands carry 8 significant bits (relative rounding ≤ 2⁻⁹): the loss within 1e-3 relative, the
    # gradient within 3 % of its largest value (identical mode: 1e-5 and 5e-6, tests/lm/test_lm_trainer.py).
    assert abs(result["loss"] - ref_loss) < 1e-3 * ref_loss
    assert np.max(np.abs(result["flat_gradients"] - ref_grad)) / np.max(np.abs(ref_grad)) < 3e-2


def test_language_model_fast_runs_repeat_their_bits():
    shape = SHAPES[1]
    batches = [np.random.default_rng(s).integers(0, 256, (shape.batch, shape.length + 1), dtype=np.int32)
               for s in range(5)]
    runs = []
    for _ in range(2):
        trainer = LanguageModelTrainer(lm_weights(shape, scale=0.02), data_schedule={}, shape=shape, lr=3e-3,
                                       executor="gpu:0", numerics="fast")
        losses = [trainer.train_step(ids)["loss"] for ids in batches]
        runs.append((losses, trainer.export_state()))
    assert runs[0][0] == runs[1][0]
    for name in ("parameters", "m", "v"):
        assert np.array_equal(runs[0][1][name].view(np.uint32), runs[1][1][name].view(np.uint32))
    assert runs[0][1]["metadata"] == {"numerics": "fast"}


TEXTS = [b"a small red panda", b"red pandas eat bamboo shoots", b"the capital of france", b"paris is in france",
         b"water boils at one hundred degrees", b"steam rises from the kettle", b"cats chase mice", b"a mouse ran"]


def encoder_run(numerics, path, steps=10):
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_vram([0]), depth=2, hidden=128, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=4, max_segments_per_device=8, max_columns_per_row=64),
        schedule=uform.Schedule(steps=steps, learning_rate=2e-3, warmup_steps=1), seed=7, numerics=numerics)
    stats = uform.TrainerStepStats()
    losses = []
    for _ in range(steps):
        trainer.step([uform.Modality.TEXT] * 8, TEXTS, stats=stats,
                     relations=uform.Relations(attract=(np.arange(9), np.arange(8) ^ 1)))
        losses.append(stats.loss)
    trainer.save(path)
    return losses


def test_encoder_fast_runs_repeat_their_bits_and_track_identical_mode(tmp_path):
    first = encoder_run("fast", tmp_path / "first.safetensors")
    second = encoder_run("fast", tmp_path / "second.safetensors")
    identical = encoder_run("identical", tmp_path / "identical.safetensors")
    assert first == second, (first, second)
    assert first != identical  # the fast kernels ran: bf16 products give other bits than the identical ones
    assert (tmp_path / "first.safetensors").read_bytes() == (tmp_path / "second.safetensors").read_bytes()
    assert uform.training.checkpoint.read_tensors(tmp_path / "first.safetensors")[0]["numerics"] == "fast"
    assert abs(first[-1] - identical[-1]) < 0.02 * abs(identical[-1]), (first, identical)


def test_fast_stack_rounds_every_weight_as_cast_bf16():
    """The fast stack's one cast over the flat parameters gives each block tensor the bits of its own cast_bf16."""
    from uform.nn.transformer import LAYER_TENSORS, TransformerStack

    trainer = uform.Trainer.init_vram(
        uform.Executor.for_vram([0]), depth=3, hidden=128, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=2, max_segments_per_device=4, max_columns_per_row=64),
        schedule=uform.Schedule(steps=1), seed=7, numerics="fast")
    model = trainer._model
    stack = TransformerStack(model.device, model.stack.geometry, 64, fast=True)
    for weights, copies in zip(model.layer_weights, stack._round_weights(model.layer_weights)):
        for name in LAYER_TENSORS:
            weight, copy = getattr(weights, name), getattr(copies, name)
            alone = model.device.empty(weight.shape, np.uint16)  # the trainer's own device (its buffers' owner)
            K.cast_bf16(alone, weight)
            whole = copy.owner.numpy()
            first = (copy.address - copy.owner.address) // 2
            assert np.array_equal(whole[first:first + copy.size].reshape(copy.shape), alone.numpy()), name
