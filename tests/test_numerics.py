"""The portable math against float64, in ulps, over a million arguments of every kind."""

import numpy as np
import pytest

from kernel_cases import unary_reference
from numerics_cases import SPECIAL, ULP_BOUNDS, arguments, ulp_errors
from uform import kernels as K


@pytest.mark.parametrize("op", sorted(K.UNARY_OPS))
def test_portable_math_ulp_error(device, op):
    x = arguments(1_000_000, seed=1)
    y = device.empty(x.shape)
    K.unary(op, y, device.put(x))
    errors = ulp_errors(op, x, y.numpy(), unary_reference)
    assert errors.size > 100_000
    assert errors.max() <= ULP_BOUNDS[op], f"{op}: {errors.max():.3f} ulp > {ULP_BOUNDS[op]}"


def test_special_values(device):
    x = SPECIAL
    out = {}
    for op in ("exp", "log", "sqrt", "sigmoid"):
        y = device.empty(x.shape)
        K.unary(op, y, device.put(x))
        out[op] = y.numpy()
    index = {v: i for i, v in enumerate(x.tolist()) if v == v}
    nan_at = int(np.flatnonzero(np.isnan(x))[0])
    assert out["exp"][index[np.inf]] == np.inf and out["exp"][index[-np.inf]] == 0.0
    assert np.isnan(out["exp"][nan_at]) and np.isnan(out["log"][nan_at])
    assert out["log"][index[0.0]] == -np.inf and np.isnan(out["log"][index[-1.0]])
    assert out["log"][index[1.0]] == 0.0 and out["exp"][index[0.0]] == 1.0
    assert out["sqrt"][index[np.inf]] == np.inf
    assert out["sigmoid"][index[np.inf]] == 1.0 and out["sigmoid"][index[-np.inf]] == 0.0


def test_subnormals_are_kept(device):
    """No flush to zero: subnormal inputs and results survive on every device."""
    x = np.array([1e-45, 1e-40, -87.5, -100.0], np.float32)
    y = device.empty(2)
    K.unary("sqrt", y, device.put(x[:2]))
    assert np.all(y.numpy() > 0)
    z = device.empty(2)
    K.unary("exp", z, device.put(x[2:]))
    assert np.all(z.numpy() > 0) and np.all(z.numpy() < np.finfo(np.float32).tiny)


@pytest.mark.parametrize("op", sorted(K.UNARY_OPS))
def test_nan_results_are_canonical(device, op):
    """Every NaN the portable math answers is 0x7FC00000, whatever NaN or domain error caused it."""
    x = arguments(200_000, seed=2)
    y = device.empty(x.shape)
    K.unary(op, y, device.put(x))
    bits = y.numpy().view(np.uint32)
    nan = np.isnan(y.numpy())
    assert nan.any()
    assert np.all(bits[nan] == 0x7FC00000)


@pytest.mark.parametrize("op", sorted(K.UNARY_OPS))
def test_lanes_give_the_bits_of_single_elements(device, op):
    """The CPU runs the portable math eight lanes at a time and the last few elements one by one: launches
    of fewer than eight elements take the one-by-one path, and must give every bit the long launch gave."""
    x = arguments(4_000, seed=3)
    whole = device.empty(x.shape)
    K.unary(op, whole, device.put(x))
    source, pieces = device.put(x), device.empty(x.shape)
    for start in range(0, x.size, 7):
        count = min(7, x.size - start)
        K.unary(op, pieces.view(start, count), source.view(start, count))
    assert np.array_equal(whole.numpy().view(np.uint32), pieces.numpy().view(np.uint32))
