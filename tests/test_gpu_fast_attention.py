"""Fast-mode attention (mojo/kernels/attention_fast.mojo): bf16 tensor cores with fp32 accumulation.

On a GPU: o, lse, dq, dk and dv against the float64 reference within bf16 tolerances, padding exactly zero, and
the same bits from two launches. Everywhere: where the fast kernels do not run (the CPU, a head dim without
them) `fast=True` gives the identical kernels' bits.
"""

import zlib

import numpy as np
import pytest

import uform
from kernel_cases import attention_inputs, case_attention, run_attention
from uform import kernels as K
from uform import layouts

needs_gpu = pytest.mark.skipif(uform.gpu_count() == 0, reason="needs a GPU engine and a GPU")

# max |out − ref| / max |ref| per output. Operands are rounded to bf16 (relative error ≤ 2⁻⁹), so scores move by
# about 2⁻⁹·|s| and each output by a few 2⁻⁹ of its scale. Measured on the H200 over FAST_SHAPES (2026-11-29):
# at most o 9.2e-3, lse 1.6e-3, dq 6.4e-3, dk 7.8e-3, dv 5.2e-3.
TOLERANCE = {"o": 1.5e-2, "lse": 4e-3, "dq": 1.5e-2, "dk": 1.5e-2, "dv": 1.5e-2}

# batch, seq_len, heads, kv_heads, head_dim, mean segment length (0: whole sequences)
FAST_SHAPES = [
    (2, 33, 2, 1, 64, 0), (1, 70, 2, 2, 32, 0), (2, 45, 1, 1, 128, 0), (1, 19, 6, 3, 16, 0),
    (1, 300, 4, 2, 64, 110), (2, 200, 2, 2, 128, 90), (1, 260, 6, 2, 32, 40), (3, 150, 2, 1, 16, 70),
    (2, 512, 4, 2, 64, 150),
]


def shape_id(shape) -> str:
    b, t, h, kv, d, segment = shape
    return f"{b}x{t}-h{h}kv{kv}d{d}-" + (f"segments{segment}" if segment else "whole")


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", FAST_SHAPES, ids=[shape_id(s) for s in FAST_SHAPES])
def test_fast_attention_is_close_to_float64(shape, causal):
    b, t, h, kv, d, segment = shape
    name = f"fast-{shape_id(shape)}-{causal}"
    outputs = case_attention(uform.Device.gpu(0), zlib.crc32(name.encode()), b, t, h, kv, d, causal,
                             segmented=segment > 0, mean_segment=segment or 5, fast=True)
    errors = {}
    for output_name, (out, ref, _) in outputs.items():
        errors[output_name] = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    assert all(errors[n] <= TOLERANCE[n] for n in errors), f"{name}: {errors} against {TOLERANCE}"
    padding = np.all(outputs["lse"][1] == 0, axis=1)  # tokens that see no key (and that no query sees)
    for output_name in ("o", "lse", "dq", "dk", "dv"):
        assert np.all(outputs[output_name][0][padding] == 0), f"{name}: {output_name} of padding is not 0"


def run(device, shape, causal, fast, seed):
    """o, dq, dk, dv, lse of attention on random inputs of `shape` (segments: random boundaries, no padding)."""
    b, t, h, kv, d, segment = shape
    rng = np.random.default_rng(seed)
    q, k, v, d_out = attention_inputs(rng, b * t, h, kv, d)
    segments = np.cumsum(rng.random(b * t) < 1 / segment).astype(np.int32) if segment else None
    spans = layouts.attention_spans(b * t, t, segments)
    return run_attention(device, q, k, v, d_out, spans, h, kv, d, causal, fast=fast)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fast_attention_gives_the_same_bits_twice(causal):
    shape = (2, 1024, 6, 2, 64, 300)  # blocks of queries from several heads sum into each key's dk and dv
    first = run(uform.Device.gpu(0), shape, causal, fast=True, seed=5)
    second = run(uform.Device.gpu(0), shape, causal, fast=True, seed=5)
    for name, a, b in zip(("o", "dq", "dk", "dv", "lse"), first, second):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{name} differs between two runs"


@pytest.mark.parametrize("shape", [(2, 70, 4, 2, 64, 0), (1, 90, 2, 1, 8, 0)], ids=["d64", "d8"])
def test_fast_falls_back_to_the_identical_kernels_where_it_has_none(device, shape):
    """The CPU has no fast kernels, and head dim 8 has none anywhere: fast=True runs the identical ones."""
    if device.is_gpu and shape[4] in K.ATTENTION_FAST_HEAD_DIMS:
        pytest.skip("the GPU has fast kernels for this head dim")
    fast = run(device, shape, causal=True, fast=True, seed=9)
    identical = run(device, shape, causal=True, fast=False, seed=9)
    for name, a, b in zip(("o", "dq", "dk", "dv", "lse"), fast, identical):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{name}: fast=True is not the identical kernel"


def test_a_fast_kernel_called_on_the_cpu_raises():
    """The fast kernels have no CPU version: called there directly (the wrappers never do), they refuse."""
    cpu = uform.Device.cpu()
    q = cpu.put(np.zeros((64, 64), np.float32))
    spans = cpu.put(layouts.attention_spans(64, 64))
    with pytest.raises(K.EngineError, match="GPU-only"):
        K._launch("attention_forward_fast", 1, o=q, lse=cpu.empty((64, 1)), q=q, k=q, v=q, spans=spans, tokens=64,
                  heads=1, kv_heads=1, head_dim=64, causal=False, scale=0.125)



@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", sorted(K.ATTENTION_FAST_HEAD_DIMS))
def test_fast_delta_is_the_identical_chain(head_dim):
    """The fast backward's δ = dO·o (attention_backward_delta_fast, 16-byte loads) has the identical kernel's bits:
    the GPU's fast δ equals the CPU's identical one."""
    rng = np.random.default_rng(head_dim)
    tokens, heads, kv_heads = 300, 4, 2
    q, k, v, d_out = attention_inputs(rng, tokens, heads, kv_heads, head_dim)
    o = rng.standard_normal(q.shape).astype(np.float32)
    lse = rng.standard_normal((tokens, heads)).astype(np.float32)
    spans = layouts.attention_spans(tokens, tokens)
    deltas = []
    for device, fast in ((uform.Device.cpu(), False), (uform.Device.gpu(0), True)):
        delta = device.empty((tokens, heads))
        dq, dk, dv = device.empty(q.shape), device.empty(k.shape), device.empty(v.shape)
        K.attention_backward(dq, dk, dv, device.put(d_out), device.put(o), device.put(lse), device.put(q),
                             device.put(k), device.put(v), spans=device.put(spans), heads=heads, kv_heads=kv_heads,
                             head_dim=head_dim, causal=False, delta=delta, fast=fast)
        deltas.append(delta.numpy())
    assert np.array_equal(deltas[0].view(np.uint32), deltas[1].view(np.uint32))
