"""The exact GEMM's definition (python/uform/reference/exact_gemm.py, issue 12) against the exact rational
product of the float32 inputs: more accurate than today's fma chain, correctly rounded for nearly every output,
NaN wherever a non-finite input reaches. (No order of k can change it: its sum is an integer one.) The engine does not run it yet; these are the properties its kernels will inherit."""

import math

import numpy as np
import pytest

from uform.reference import exact_gemm as X

SCALE = 149  # every float32 is an integer multiple of 2^-149


def as_integers(x: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda v: int(np.ldexp(np.float64(v), SCALE)), otypes=[object])(x)


def exact_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ_k a_ik b_kj exactly, as integers in units of 2^-298."""
    return as_integers(a).dot(as_integers(b))


def correctly_rounded(exact: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda v: X.round_to_float32(int(v), 2 * SCALE), otypes=[np.float32])(exact)


def fma_chain(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Today's identical-mode GEMM: one fma chain over k from +0 per output (an fp32 fma is exact in
    float64 and then rounded once, for the magnitudes drawn here)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(a.shape[1]):
        c = (a64[:, k:k + 1] * b64[k:k + 1, :] + c.astype(np.float64)).astype(np.float32)
    return c


def draws(rng, m, k, n, spread):
    """GEMMul8's family: (u − ½)·e^(φ·N(0,1)), φ = spread."""
    a = ((rng.random((m, k)) - 0.5) * np.exp(spread * rng.standard_normal((m, k)))).astype(np.float32)
    b = ((rng.random((k, n)) - 0.5) * np.exp(spread * rng.standard_normal((k, n)))).astype(np.float32)
    return a, b


def test_rounding_matches_a_single_float64_to_float32_rounding():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        magnitude = int(rng.integers(1, 2**53))
        shift = int(rng.integers(-60, 240))
        x = magnitude if rng.random() < 0.5 else -magnitude
        expected = np.float64(math.ldexp(float(x), -shift)).astype(np.float32)  # exact double, one rounding
        assert X.round_to_float32(x, shift).view(np.uint32) == expected.view(np.uint32), (x, shift)


def test_moduli_bound_every_sum():
    for k in (1, 2, 768, 4096, 4097, 65536, 65537, X.MAX_K):
        bits, count = X.bits_per_side(k), X.moduli_count(k)
        assert k * 2 ** (2 * bits) < math.prod(X.MODULI[:count]) // 2
    with pytest.raises(ValueError):
        X.moduli_count(X.MAX_K + 1)


def test_non_finite_lines_give_nan_and_only_there():
    rng = np.random.default_rng(3)
    a, b = draws(rng, 4, 20, 3, 1.0)
    a[1, 7], b[2, 2] = np.inf, np.nan
    c = X.exact_gemm(a, b)
    touched = np.zeros((4, 3), bool)
    touched[1, :], touched[:, 2] = True, True
    assert np.isnan(c[touched]).all() and np.isfinite(c[~touched]).all()
    clean = X.exact_gemm(np.delete(a, 1, 0), np.delete(b, 2, 1))
    assert np.array_equal(np.delete(np.delete(c, 1, 0), 2, 1).view(np.uint32), clean.view(np.uint32))


@pytest.mark.parametrize("k,spread", [(768, 0.5), (768, 2.0), (3072, 1.0), (4096, 2.0), (65536, 1.0)])
def test_more_accurate_than_the_fma_chain(k, spread):
    """Median and worst error, each output's against Σ|a||b|, at or below the fma chain's; at least 99 % of the
    outputs are the correctly rounded exact product (issue 12 asks 95 % at k ≤ 4096; measured: 99.2–100 %)."""
    rng = np.random.default_rng(k + int(10 * spread))
    m = n = 8 if k > 4096 else 16
    a, b = draws(rng, m, k, n, spread)
    exact = exact_product(a, b)
    value = np.vectorize(lambda v: math.ldexp(float(v), -2 * SCALE), otypes=[np.float64])(exact)
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    ours, chain = X.exact_gemm(a, b), fma_chain(a, b)
    ours_error = np.abs(ours - value) / magnitude
    chain_error = np.abs(chain - value) / magnitude
    assert np.median(ours_error) <= np.median(chain_error) and ours_error.max() <= chain_error.max()
    assert np.mean(ours == correctly_rounded(exact)) >= 0.99


def test_edges_zero_lines_subnormal_and_overflowing_outputs():
    one_eighth_above = np.float32(1 + 2**-3)
    a = np.array([[0.0, 0.0], [1e-30, 1e-30], [3e38, 3e38], [1.0, -1.0], [2.0**-140, 0.0],
                  [one_eighth_above, 0.0]], np.float32)
    b = np.array([[1e-20, 2.0**-5], [1e-20, 2.0**-5]], np.float32)
    c = X.exact_gemm(a, b)
    bits = c.view(np.uint32)
    assert bits[0].tolist() == [0, 0]  # an all-zero row gives +0
    assert bits[1, 0] == 0  # 2e-50 lies below half the smallest subnormal: +0
    assert np.isfinite(c[2]).all()  # 3e38·(1e-20 + 1e-20) and 3e38·2^-4 are finite
    assert np.isposinf(X.exact_gemm(a[2:3], np.array([[2.0], [2.0]], np.float32))[0, 0])  # 1.2e39 overflows
    assert bits[3].tolist() == [0, 0]  # an exact cancellation gives +0
    assert c[4, 1] == np.float32(2.0**-145)  # a subnormal output, exact
    # (1 + 2^-3)·2^-147 lies halfway between the subnormals 4·2^-149 and 5·2^-149: ties to even, 2^-147
    assert X.exact_gemm(a[5:], np.array([[2.0**-147], [0.0]], np.float32))[0, 0] == np.float32(2.0**-147)
