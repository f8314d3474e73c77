"""Every kernel against its float64 numpy reference, on the CPU (and a GPU when one is there)."""

import zlib

import numpy as np
import pytest

from kernel_cases import all_cases, attention_inputs, run_attention
from uform import kernels as K


@pytest.mark.parametrize("name,case,kwargs", all_cases(), ids=[c[0] for c in all_cases()])
def test_kernel_matches_float64_reference(device, name, case, kwargs):
    outputs = case(device, seed=zlib.crc32(name.encode()), **kwargs)
    for output_name, (out, ref, tolerance, *magnitude) in outputs.items():
        assert out.shape == ref.shape, output_name
        assert np.all(np.isfinite(out)), f"{name}/{output_name}: non-finite output"
        error = np.max(np.abs(out - ref)) / ((magnitude[0] if magnitude else np.max(np.abs(ref))) + 1e-30)
        assert error <= tolerance, f"{name}/{output_name}: relative error {error:.3g} > {tolerance:.3g}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_attention_of_a_segment_is_the_same_wherever_it_lies(device, causal, head_dim):
    """Attention's blocks start at each span's first token, so a segment gives the same bits at any offset in
    the batch, beside any other segments: a 150-token segment alone, then after 37 and before 80 other tokens."""
    rng = np.random.default_rng(head_dim + causal)
    heads, kv_heads, length, before, after = 4, 2, 150, 37, 80
    tokens = before + length + after
    q, k, v, d_out = attention_inputs(rng, tokens, heads, kv_heads, head_dim)
    segments = np.r_[np.zeros(before - 5), -np.ones(5), np.ones(length), np.full(after, 2)].astype(np.int32)
    placed = run_attention(device, q, k, v, d_out, K.attention_spans(tokens, tokens, segments), heads, kv_heads,
                           head_dim, causal)
    inside = slice(before, before + length)
    alone = run_attention(device, q[inside], k[inside], v[inside], d_out[inside],
                          K.attention_spans(length, length), heads, kv_heads, head_dim, causal)
    for name, a, b in zip(("o", "dq", "dk", "dv", "lse"), alone, placed):
        assert np.array_equal(a.view(np.uint32), b[inside].view(np.uint32)), name


@pytest.mark.parametrize("k", [3, 4096, 70000])
def test_exact_gemm_gives_its_definitions_bits_in_any_order_of_k(device, k):
    """kernels.gemm_exact equals uform.reference.exact_gemm bit for bit (zeros' signs included), and permuting
    k changes no bit; k = 70000 takes 12 moduli' budget."""
    from uform.reference import exact_gemm

    rng = np.random.default_rng(k)
    m, n = 3, 2
    a = ((rng.random((m, k)) - 0.5) * np.exp(rng.standard_normal((m, k)))).astype(np.float32)
    b = ((rng.random((k, n)) - 0.5) * np.exp(rng.standard_normal((k, n)))).astype(np.float32)
    order = rng.permutation(k)
    results = []
    for left, right in ((a, b), (a[:, order], b[order])):
        c = device.empty((m, n))
        K.gemm_exact(c, device.put(np.ascontiguousarray(left)), device.put(np.ascontiguousarray(right)), m, n, k)
        results.append(c.numpy().view(np.uint32))
    assert np.array_equal(results[0], results[1])
    assert np.array_equal(results[0], exact_gemm.exact_gemm(a, b).view(np.uint32))
