"""The identical numerics: every kernel gives the same bits on the CPU and on a GPU.

Runs only where the engine has a GPU (tools/gpu-check runs it on the H200); each
case draws its inputs once and runs on both devices.
"""

import zlib

import numpy as np
import pytest

import uform
from kernel_cases import all_cases, gemm_group_operands
from numerics_cases import arguments
from uform import kernels as K
from uform.lm import LanguageModelConfig, LanguageModelTrainer, state_sha256

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(uform.gpu_count() == 0, reason="needs a GPU engine and a GPU")]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name,case,kwargs", all_cases(), ids=[c[0] for c in all_cases()])
def test_kernel_bits_match_cpu(name, case, kwargs):
    seed = zlib.crc32(name.encode())
    on_cpu = case(uform.Device.cpu(), seed=seed, **kwargs)
    on_gpu = case(uform.Device.gpu(0), seed=seed, **kwargs)
    for output_name in on_cpu:
        cpu, gpu = on_cpu[output_name][0], on_gpu[output_name][0]
        differing = int(np.count_nonzero(cpu.view(np.uint32) != gpu.view(np.uint32)))
        assert same_bits(cpu, gpu), f"{name}/{output_name}: {differing} of {cpu.size} values differ"


ATTENTION_CASES = [c for c in all_cases() if c[0].startswith("attention-")]


@pytest.mark.parametrize("form", ["teams", "rows"])
@pytest.mark.parametrize("name,case,kwargs", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention_bits_match_cpu_in_both_forms(monkeypatch, form, name, case, kwargs):
    """Every attention case in each identical form forced (UFORM_ATTENTION) on both devices: the GPU's teams of
    256 threads and its warps a row give the CPU's bits."""
    monkeypatch.setenv("UFORM_ATTENTION", form)
    seed = zlib.crc32(name.encode())
    on_cpu = case(uform.Device.cpu(), seed=seed, **kwargs)
    on_gpu = case(uform.Device.gpu(0), seed=seed, **kwargs)
    for output_name in on_cpu:
        cpu, gpu = on_cpu[output_name][0], on_gpu[output_name][0]
        assert same_bits(cpu, gpu), f"{name}/{output_name}: {int(np.count_nonzero(cpu != gpu))} values differ"


@pytest.mark.parametrize("name,case,kwargs", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention_with_kept_score_gradients_bits_match_cpu(monkeypatch, name, case, kwargs):
    """Every attention case with the dq kernel reading kept score gradients on both devices: the CPU's bits, with
    span_limit the sequence's length (every tile reads them) and a third of it (a segmented case then has tiles of
    both kinds, as its random segments fall)."""
    monkeypatch.setenv("UFORM_ATTENTION", "teams")
    seed = zlib.crc32(name.encode())
    for limit in (kwargs["seq_len"], max(kwargs["seq_len"] // 3, 1)):
        on_cpu = case(uform.Device.cpu(), seed=seed, **kwargs, span_limit=limit)
        on_gpu = case(uform.Device.gpu(0), seed=seed, **kwargs, span_limit=limit)
        for output_name in on_cpu:
            cpu, gpu = on_cpu[output_name][0], on_gpu[output_name][0]
            differing = int(np.count_nonzero(cpu != gpu))
            assert same_bits(cpu, gpu), f"{name}/{output_name}, span_limit {limit}: {differing} values differ"


@pytest.mark.parametrize("summed", [False, True], ids=["apart", "summed"])
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("m,sizes,shared", [(64, (32, 16, 16), 32), (37, (5, 13, 8), 19), (130, (70, 129, 3), 257),
                                             (40, (24, 8, 16), 5000)])
def test_gemm_group_bits_match_cpu(summed, transpose_a, transpose_b, m, sizes, shared):
    """gemm_group in one GPU launch (or its products one after another, where they are cut into k ranges): the
    CPU's bits."""
    results = []
    for device in (uform.Device.cpu(), uform.Device.gpu(0)):
        shapes, a, b, c0 = gemm_group_operands(np.random.default_rng(m + shared), m, sizes, shared, transpose_a,
                                               transpose_b, summed)
        cs = [device.put(c0[0])] * 3 if summed else [device.put(x) for x in c0]
        K.gemm_group(cs, [device.put(x) for x in a], [device.put(x) for x in b], m, [n for n, _ in shapes],
                     [k for _, k in shapes], transpose_a=transpose_a, transpose_b=transpose_b, summed=summed,
                     accumulate=True)
        results.append([c.numpy() for c in cs[:1 if summed else 3]])
    for cpu, gpu in zip(*results):
        assert same_bits(cpu, gpu)


@pytest.mark.parametrize("transpose_a,k_range", [(False, 0), (True, 512)])
def test_exact_group_of_one_a_bits_match_cpu(transpose_a, k_range):
    """Exact products apart of one A, grouped (A's planes found once on the GPU): the CPU's bits."""
    m, k, sizes = 520, 1024, (512, 520, 640)
    results = []
    for device in (uform.Device.cpu(), uform.Device.gpu(0)):
        rng = np.random.default_rng(13)
        a = device.put(rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32))
        bs = [device.put(rng.standard_normal((k, n)).astype(np.float32)) for n in sizes]
        cs = [device.empty((m, n)) for n in sizes]
        K.gemm_group(cs, [a] * 3, bs, m, list(sizes), [k] * 3, transpose_a=transpose_a, k_range=k_range)
        results.append([c.numpy() for c in cs])
    for cpu, gpu in zip(*results):
        assert same_bits(cpu, gpu)


@pytest.mark.parametrize("op", sorted(K.UNARY_OPS))
def test_portable_math_bits_match_cpu(op):
    x = arguments(4_000_000, seed=7)
    results = []
    for device in (uform.Device.cpu(), uform.Device.gpu(0)):
        y = device.empty(x.shape)
        K.unary(op, y, device.put(x))
        results.append(y.numpy())
    differing = int(np.count_nonzero(results[0].view(np.uint32) != results[1].view(np.uint32)))
    assert differing == 0, f"{op}: {differing} of {x.size} results differ between CPU and GPU"


GEMM_CASES = [c for c in all_cases() if c[0].startswith("gemm-")]


TILINGS = ["large", "large-k16", "small", "small-8x8", "tiny"]  # UFORM_GEMM_TILE (mojo/kernels/gemm/fma.mojo)


@pytest.mark.parametrize("tile", TILINGS)
@pytest.mark.parametrize("name,case,kwargs", GEMM_CASES, ids=[c[0] for c in GEMM_CASES])
def test_gemm_bits_match_cpu_in_every_tiling(monkeypatch, tile, name, case, kwargs):
    """Every GEMM case with each GPU tiling forced (UFORM_GEMM_TILE): the CPU's bits."""
    monkeypatch.setenv("UFORM_GEMM_TILE", tile)
    seed = zlib.crc32(name.encode())
    cpu = case(uform.Device.cpu(), seed=seed, **kwargs)["c"][0]
    gpu = case(uform.Device.gpu(0), seed=seed, **kwargs)["c"][0]
    assert same_bits(cpu, gpu), f"{name}: {int(np.count_nonzero(cpu.view(np.uint32) != gpu.view(np.uint32)))} differ"


@pytest.mark.parametrize("tile", ["auto"] + TILINGS)
@pytest.mark.parametrize("m,n,k,transpose_a,transpose_b,accumulate", [
    (1000, 1100, 1200, False, False, False),  # 72 large tiles: small unless forced
    (1600, 1700, 300, False, True, True),
    (2048, 4096, 256, False, False, False),  # 512 large tiles, just under the threshold: small
    (4096, 2304, 192, True, False, True),  # 576 large tiles: large
    (1031, 2053, 517, True, False, False),  # no dimension a multiple of 4: the scalar loads and stores
    (2051, 1029, 259, False, True, True),
    (768, 768, 16384, True, False, False),  # split into 32 k ranges of 512 (the weight-gradient form)
    (390, 130, 8200, True, False, True),  # 32 ranges (31 of 264, the last 16), rows not a multiple of 4
    (256, 512, 8192, True, False, False),  # the byte LM's large weight gradient: 32 ranges of 256, 256 large blocks
], ids=lambda v: str(int(v)) if isinstance(v, bool) else str(v))
def test_large_gemm_bits_match_cpu(monkeypatch, tile, m, n, k, transpose_a, transpose_b, accumulate):
    """Larger products of the fma chain (kernels.gemm_fma: some of these shapes kernels.gemm takes exactly), in the
    dispatch's own tiling and in every forced one, every transpose, partial tiles at every edge, the 128-bit and
    the scalar paths, with and without C0 and k ranges: the CPU's bits."""
    if tile != "auto":
        monkeypatch.setenv("UFORM_GEMM_TILE", tile)
    assert same_bits(*products_on_both(K.gemm_fma, m, n, k, transpose_a, transpose_b, accumulate=accumulate))


def products_on_both(product, m: int, n: int, k: int, transpose_a: bool, transpose_b: bool, scaled_rows=False,
                     **options) -> list[np.ndarray]:
    """C = C0 (+)= op(A)·op(B) by `product` (a kernels GEMM) on the CPU and on the GPU, from one draw of random
    operands (A's rows scaled by e^N(0, 1) where scaled_rows): the two results."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((k, m) if transpose_a else (m, k)).astype(np.float32)
    if scaled_rows:
        a *= np.exp(rng.standard_normal((k, 1) if transpose_a else (m, 1))).astype(np.float32)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    results = []
    for device in (uform.Device.cpu(), uform.Device.gpu(0)):
        c = device.put(c0)
        product(c, device.put(a), device.put(b), m, n, k, transpose_a=transpose_a, transpose_b=transpose_b, **options)
        results.append(c.numpy())
    return results


@pytest.mark.parametrize("m,n,k,transpose_a", [(8192, 8192, 8192, False), (65536, 768, 768, False),
                                                (768, 768, 65536, True), (3072, 768, 65536, True)])
def test_large_exact_gemm_bits_match_cpu(m, n, k, transpose_a):
    """The exact GEMM at issue 12's sizes: the H200's fused form (its own tiles and splits; over k = 65536 the
    unfused form, which fused_pays picks there, and the fused kernel in the 7 ranges it would split k into) gives
    the CPU's residue form's bits (the CPU's own moduli and planes: only the integer X is shared), up to 8192³ and
    k = 65536."""
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(np.float32) * np.exp(rng.standard_normal((m, 1))).astype(np.float32)
    stored_a = np.ascontiguousarray(a.T) if transpose_a else a
    b = rng.standard_normal((k, n)).astype(np.float32)
    runs = [(uform.Device.cpu(), True, 0), (uform.Device.gpu(0), "fused", 0)]
    if k == 65536:
        runs.append((uform.Device.gpu(0), "fused", 7))
    results = []
    for device, residues, splits in runs:
        c = device.empty((m, n))
        K.gemm_exact(c, device.put(stored_a), device.put(b), m, n, k, transpose_a=transpose_a, residues=residues,
                     splits=splits)
        results.append(c.numpy())
    assert all(same_bits(results[0], result) for result in results[1:])


@pytest.mark.parametrize("m,n,k,k_range,transpose_a,transpose_b", [
    (65536, 768, 768, 0, False, False), (4096, 3072, 768, 0, False, True), (768, 3072, 16 * 1024, 1024, True, False),
    (3072, 768, 8 * 1024, 1024, True, False), (520, 600, 4 * 520 + 7, 520, True, False), (768, 768, 4096, 0, True, False),
    (768, 768, 8 * 8192, 8192, True, False), (512, 640, 4 * 4096, 4096, True, False),
])
def test_identical_gemm_through_the_exact_gemm_bits_match_cpu(m, n, k, k_range, transpose_a, transpose_b):
    """kernels.gemm where its shape rule takes the exact GEMM, at the encoder's shapes: the H200's fused form (weight
    gradients by packed rows, or blocks of rows: the ranges' products in one fused launch for ranges of whole
    128-token stages, else one product a range) gives the CPU's residue form's bits."""
    assert K.gemm_is_exact(m, n, k, k_range)
    assert same_bits(*products_on_both(K.gemm, m, n, k, transpose_a, transpose_b, scaled_rows=True, accumulate=True,
                                       k_range=k_range))


@pytest.mark.parametrize("m,n,k,ta,tb,acc", [(1, 1, 1, False, False, False), (130, 257, 100, False, False, True),
                                              (257, 130, 300, True, False, True), (129, 200, 77, False, True, False),
                                              (520, 390, 768, False, True, True), (133, 9, 70000, False, False, True),
                                              (20, 131, 140000, True, False, False)])
def test_fused_exact_gemm_gives_the_residue_forms_bits(m, n, k, ta, tb, acc):
    """The fused exact GEMM (wgmma over the moduli, the reconstruction in its epilogue; k in one range, in two, or
    as the kernel chooses: the splits' residues summed by a second kernel) equals the unfused residue form on the
    GPU bit for bit, and both the definition
    (uform.reference.exact_gemm; NaN where a row or column holds an infinity or a NaN): shapes that are not
    multiples of the tile, every layout, accumulate, a zero row and column, k past one int32 chunk (2^16; 12
    moduli), infinities and NaNs."""
    from uform.reference import exact_gemm

    rng = np.random.default_rng(m * n + k)
    a = ((rng.random((m, k)) - 0.5) * np.exp(2 * rng.standard_normal((m, k)))).astype(np.float32)
    b = ((rng.random((k, n)) - 0.5) * np.exp(2 * rng.standard_normal((k, n)))).astype(np.float32)
    a[m // 2] = 0.0
    b[:, n // 2] = 0.0
    if m > 2 and n > 2:
        a[m - 1, k // 3], b[k - 1, 1] = np.inf, np.nan
    c0 = np.random.default_rng(k).standard_normal((m, n)).astype(np.float32)
    stored_a = np.ascontiguousarray(a.T) if ta else a
    stored_b = np.ascontiguousarray(b.T) if tb else b
    device = uform.Device.gpu(0)
    results = []
    for residues, splits in ((True, 0), ("fused", 0), ("fused", 1), ("fused", 2)):
        c = device.put(c0)
        K.gemm_exact(c, device.put(stored_a), device.put(stored_b), m, n, k, transpose_a=ta, transpose_b=tb,
                     accumulate=acc, residues=residues, splits=splits)
        results.append(c.numpy())
    unfused, fused = results[0], results[1]
    for splits, result in zip((0, 1, 2), results[1:]):
        differing = int(np.count_nonzero(unfused.view(np.uint32) != result.view(np.uint32)))
        assert same_bits(unfused, result), f"splits={splits}: {differing} of {result.size} outputs differ"
    expected = exact_gemm.exact_gemm(a, b)
    if acc:
        expected = c0 + expected  # one float32 addition
    assert np.array_equal(np.isnan(fused), np.isnan(expected))
    finite = ~np.isnan(expected)
    assert np.array_equal(fused[finite].view(np.uint32), expected[finite].view(np.uint32))


@pytest.mark.parametrize("vocab", [5, 40, 256])
def test_cross_entropy_bits_match_cpu_on_special_logits(vocab):
    """A GPU warp takes a row's maximum in 32 lanes (engine.reduction.row_max_of), the CPU one logit after
    another: a NaN first or later, infinities, a row of −∞, ties of +0 and −0 at the maximum, and ordinary rows
    give the same losses and gradients (bit for bit, a NaN matching a NaN: x86 and CUDA write different NaNs)."""
    rng = np.random.default_rng(vocab)
    z = (3 * rng.standard_normal((12, vocab))).astype(np.float32)
    z[0, 0] = np.nan
    z[1, vocab - 1] = np.nan
    z[2, :] = -np.inf
    z[3, vocab // 2] = np.inf
    z[4, :] = -1.0
    z[4, vocab - 1], z[4, min(1, vocab - 1)] = 0.0, -0.0
    z[5, :] = -np.abs(z[5, :])
    z[5, 0], z[5, vocab - 1] = -0.0, 0.0
    targets = rng.integers(0, vocab, 12).astype(np.int32)
    targets[6] = -1
    results = []
    for device in (uform.Device.cpu(), uform.Device.gpu(0)):
        losses, dz = device.empty(12), device.empty(z.shape)
        K.cross_entropy(losses, dz, device.put(z), device.put(targets), grad_scale=0.25)
        results.append((losses.numpy(), dz.numpy()))
    for cpu, gpu in zip(*results):
        nan = np.isnan(cpu)
        assert np.array_equal(nan, np.isnan(gpu)) and same_bits(cpu[~nan], gpu[~nan])


@pytest.mark.parametrize("shape", [
    LanguageModelConfig(),
    LanguageModelConfig(batch=4, length=64, width=128, heads=4, kv_heads=2, mlp=256, layers=3),
    LanguageModelConfig(batch=2, length=256, width=512, heads=4, kv_heads=2, mlp=1024, layers=2),
], ids=["default", "wide", "exact"])
def test_language_model_run_bits_match_cpu(shape, monkeypatch):
    """100 steps (20 for the wider shapes) on the CPU and on the GPU, its steps replayed as a device graph, as a
    loop of launches and launched from Python (UFORM_STEP_PLANS): the same losses, logits and state. The exact
    shape's products run the exact GEMM (its shape rule)."""
    steps = 100 if shape == LanguageModelConfig() else 20
    rng = np.random.default_rng(5)
    weights = (rng.standard_normal(shape.n_total) * 0.05).astype(np.float32)
    data = [rng.integers(0, 256, (shape.batch, shape.length + 1), dtype=np.int32) for _ in range(steps)]
    runs = []
    for executor, plans in (("cpu", "loop"), ("gpu:0", "graph"), ("gpu:0", "loop"), ("gpu:0", "off")):
        monkeypatch.setenv("UFORM_STEP_PLANS", plans)
        trainer = LanguageModelTrainer(weights, data_schedule={}, shape=shape, executor=executor, resident=True)
        losses = [trainer.train_step(ids)["loss"] for ids in data]
        logits = trainer.logits(data[0][:, :-1])
        runs.append((losses, logits, state_sha256(trainer.export_state())))
    cpu_losses, cpu_logits, cpu_sha = runs[0]
    for gpu_losses, gpu_logits, gpu_sha in runs[1:]:
        assert cpu_losses == gpu_losses
        assert same_bits(cpu_logits, gpu_logits)
        assert cpu_sha == gpu_sha


def test_joint_training_bits_match_cpu(tmp_path):
    """The same 20 JOINT steps on the CPU and on the GPU: bit-identical checkpoint tensors; and a run saved at
    step 10 and resumed on the GPU ends bit-identical to the uninterrupted one."""
    from safetensors.numpy import load_file

    texts = [f"item {i}: {'abcdefghij'[i % 10] * (i % 7 + 3)} and more text {i * 37 % 101}" for i in range(24)]
    partners = [i ^ 1 for i in range(24)]

    def run(executor, steps, resume=None):
        trainer = uform.Trainer.init_vram(
            uform.Executor.for_ram() if executor == "cpu" else uform.Executor.for_vram([0]), resume=resume,
            depth=2, hidden=128, objective=uform.Objective.JOINT,
            batch=uform.BatchShape(max_rows_per_device=8, max_segments_per_device=24, max_columns_per_row=96),
            contrastive=uform.Contrastive(matryoshka_dimensions=(64, 128), temperature_groups=2),
            schedule=uform.Schedule(steps=20, learning_rate=2e-3), seed=11)
        for step in range(trainer.completed_steps, steps):
            order = np.roll(np.arange(24), step)
            trainer.step([uform.Modality.TEXT] * 24, [texts[i] for i in order],
                         temperature_groups=[i % 2 for i in order],
                         relations=uform.Relations(attract=(np.arange(25), np.argsort(order)[[partners[i] for i in order]])))
        path = tmp_path / f"{executor}-{steps}-{resume is not None}.safetensors"
        trainer.save(path)
        return path

    tensors = [load_file(run(executor, 20)) for executor in ("cpu", "gpu")]
    assert tensors[0].keys() == tensors[1].keys()
    for name in tensors[0]:
        assert same_bits(tensors[0][name], tensors[1][name]), name
    half = run("gpu", 10)
    resumed = load_file(run("gpu", 20, resume=half))
    for name in resumed:
        assert same_bits(resumed[name], tensors[1][name]), name


def test_encoder_training_through_the_exact_gemm_bits_match_cpu(tmp_path):
    """5 JOINT steps of a model whose products the exact GEMM's shape rule takes (hidden 512, an MLP of 2048, 16
    packed rows of 512 tokens, so every weight gradient is an exact product a block of 8 rows, the two blocks added
    in the row tree) on the CPU and on the GPU: bit-identical checkpoints."""
    texts = [f"item {i}: " + "abcdefghij"[i % 10] * (40 + 13 * i) for i in range(8)]

    def run(executor):
        trainer = uform.Trainer.init_vram(
            uform.Executor.for_ram() if executor == "cpu" else uform.Executor.for_vram([0]),
            depth=1, hidden=512, objective=uform.Objective.JOINT,
            batch=uform.BatchShape(max_rows_per_device=16, max_segments_per_device=8, max_columns_per_row=512),
            schedule=uform.Schedule(steps=5, learning_rate=2e-3), seed=7)
        for step in range(5):
            order = np.roll(np.arange(8), step)
            trainer.step([uform.Modality.TEXT] * 8, [texts[i] for i in order],
                         relations=uform.Relations(attract=(np.arange(9), np.argsort(order)[order ^ 1])))
        path = tmp_path / f"{executor}.safetensors"
        trainer.save(path)
        return path

    from safetensors.numpy import load_file

    tensors = [load_file(run(executor)) for executor in ("cpu", "gpu")]
    for name in tensors[0]:
        assert same_bits(tensors[0][name], tensors[1][name]), name


def test_media_training_bits_match_cpu(tmp_path):
    """10 JOINT steps of text with PNG, JPEG and WebP images, MP4 and WebM clips and WAV and FLAC audio on the
    CPU and on the GPU: bit-identical checkpoint tensors; a run saved at step 5 and resumed on the GPU ends
    bit-identical to the uninterrupted one."""
    from safetensors.numpy import load_file
    from media_files import MEDIA_SHAPES, mixed_items, sample_files

    modalities, contents, relations = mixed_items(sample_files())

    def run(executor, steps, resume=None):
        trainer = uform.Trainer.init_vram(
            uform.Executor.for_ram() if executor == "cpu" else uform.Executor.for_vram([0]), resume=resume,
            depth=2, hidden=128, objective=uform.Objective.JOINT,
            batch=uform.BatchShape(max_rows_per_device=4, max_segments_per_device=14, max_columns_per_row=48,
                                   **MEDIA_SHAPES),
            schedule=uform.Schedule(steps=10, learning_rate=2e-3, warmup_steps=1), seed=13)
        for _ in range(trainer.completed_steps, steps):
            trainer.step(modalities, contents, relations=relations)
        path = tmp_path / f"{executor}-{steps}-{resume is not None}.safetensors"
        trainer.save(path)
        return path

    tensors = [load_file(run(executor, 10)) for executor in ("cpu", "gpu")]
    assert tensors[0].keys() == tensors[1].keys() and "audio.reconstruction" in tensors[0]
    for name in tensors[0]:
        assert same_bits(tensors[0][name], tensors[1][name]), name
    resumed = load_file(run("gpu", 10, resume=run("gpu", 5)))
    for name in resumed:
        assert same_bits(resumed[name], tensors[1][name]), name


def test_loaded_encoder_on_the_gpu_embeds_as_the_cpu_trainer(tmp_path):
    """A checkpoint saved by a CPU trainer, loaded on the GPU: the same embedding bits as the trainer's own
    encode, and an item's embedding alone equals its embedding inside a batch of 100 others."""
    texts = [f"pair {i}: {'klmnopqrst'[i % 10] * (i % 5 + 2)} words {i * 13 % 37}" for i in range(8)]
    trainer = uform.Trainer.init_vram(
        uform.Executor.for_ram(), depth=2, hidden=128, objective=uform.Objective.JOINT,
        batch=uform.BatchShape(max_rows_per_device=4, max_segments_per_device=8, max_columns_per_row=64),
        contrastive=uform.Contrastive(matryoshka_dimensions=(64, 128)), schedule=uform.Schedule(steps=4), seed=5)
    for _ in range(3):
        trainer.step([uform.Modality.TEXT] * 8, texts, relations=uform.Relations(attract=(np.arange(9), [i ^ 1 for i in range(8)])))
    trainer.save(tmp_path / "model.safetensors")

    encoder = uform.Encoder.load(tmp_path / "model.safetensors", executor=uform.Executor.for_vram([0]))
    on_gpu = encoder.encode(uform.Modality.TEXT, texts, batch_size=3)
    assert same_bits(on_gpu, trainer.encode([uform.Modality.TEXT] * 8, texts))
    crowd = [f"member {i} of a crowd of others" for i in range(100)]
    among = encoder.encode(uform.Modality.TEXT, crowd[:61] + texts[2:3] + crowd[61:], batch_size=16)
    assert same_bits(among[61:62], on_gpu[2:3])


def test_late_interaction_and_choices_training_bits_match_cpu(tmp_path):
    """10 JOINT steps with late interaction (every side) and calibrated choices on the CPU and on the GPU:
    bit-identical checkpoint tensors; a run saved at step 5 and resumed on the GPU ends bit-identical; and
    text_choose and encode_tokens give the CPU's bits."""
    from safetensors.numpy import load_file

    sides = [uform.LateInteractionSide(i % 4) for i in range(12)]
    texts = [f"state {i}: {'uvwxyz'[i % 6] * (i % 4 + 2)} then {i * 29 % 83}" for i in range(12)]
    choices = ["yn", "", "abc", "0123", "", "xy"] * 2
    targets = [np.float32(t) for t in ([0.7, 0.3], [], [0.2, 0.3, 0.5], [0.4, 0.3, 0.2, 0.1], [], [1.0, 0.0])] * 2

    def run(executor, steps, resume=None):
        trainer = uform.Trainer.init_vram(
            uform.Executor.for_ram() if executor == "cpu" else uform.Executor.for_vram([0]), resume=resume,
            depth=2, hidden=128, objective=uform.Objective.JOINT,
            batch=uform.BatchShape(max_rows_per_device=4, max_segments_per_device=12, max_columns_per_row=64,
                                   max_choices_per_item=4),
            contrastive=uform.Contrastive(temperature_groups=2),
            late_interaction=uform.LateInteraction(weight=0.5, width=32, max_query_span=6),
            choices=uform.Choices(weight=0.5), schedule=uform.Schedule(steps=10, learning_rate=2e-3), seed=17)
        for step in range(trainer.completed_steps, steps):
            order = np.roll(np.arange(12), step)
            trainer.step([uform.Modality.TEXT] * 12, [texts[i] for i in order], sides=[sides[i] for i in order],
                         temperature_groups=[i % 2 for i in order], choices=[choices[i] for i in order],
                         choice_targets=[targets[i] for i in order],
                         relations=uform.Relations(attract=(np.arange(13), np.argsort(order)[[i ^ 1 for i in order]])))
        path = tmp_path / f"{executor}-{steps}-{resume is not None}.safetensors"
        trainer.save(path)
        return path, trainer

    (cpu_path, cpu), (gpu_path, gpu) = run("cpu", 10), run("gpu", 10)
    tensors = [load_file(cpu_path), load_file(gpu_path)]
    assert "late_interaction.token_head" in tensors[0]
    for name in tensors[0]:
        assert same_bits(tensors[0][name], tensors[1][name]), name
    resumed = load_file(run("gpu", 10, resume=run("gpu", 5)[0])[0])
    for name in resumed:
        assert same_bits(resumed[name], tensors[1][name]), name
    assert same_bits(np.asarray(cpu.text_choose(texts, choices)), np.asarray(gpu.text_choose(texts, choices)))
    for ours, theirs in zip(cpu.encode_tokens([uform.Modality.TEXT] * 12, texts),
                            gpu.encode_tokens([uform.Modality.TEXT] * 12, texts)):
        assert same_bits(ours, theirs)
