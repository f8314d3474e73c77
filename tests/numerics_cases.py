"""Arguments for the portable math: random bit patterns over the whole float32 line,
plus subnormals, values near overflow and underflow, and the special values."""

from __future__ import annotations

import numpy as np

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 88.72, -103.9, 1e-45, -1e-45, 1.1754942e-38,
                    3.4028235e38, -3.4028235e38, 0.5, 2.0, 1e-7, -1e-7], np.float32)

# The domain where each op's result is a finite, normal float32 worth comparing in ulps.
DOMAINS = {
    "exp": (-87.3, 88.7), "log": (0.0, np.inf), "log1p": (-1.0, np.inf), "sqrt": (0.0, np.inf),
    "rsqrt": (0.0, np.inf), "sigmoid": (-87.0, np.inf), "softplus": (-87.0, 1e30),
    "silu": (-80.0, 1e30), "silu_derivative": (-80.0, 80.0),
}


def arguments(count: int, seed: int = 0) -> np.ndarray:
    """`count` float32 values: uniform bit patterns (so every exponent is hit), dense small ones, specials."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, count // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    moderate = (rng.standard_normal(count // 4) * 30).astype(np.float32)
    subnormal = rng.integers(1, 2**23, count - count // 2 - count // 4, dtype=np.uint32).view(np.float32)
    return np.concatenate([bits, moderate, subnormal, -subnormal[: len(subnormal) // 2], SPECIAL])


# Measured maximum error in ulps over 4M arguments (see docs/numerics.md); the tests allow these.
ULP_BOUNDS = {"exp": 1.0, "log": 2.0, "log1p": 3.5, "sqrt": 0.5, "rsqrt": 1.5, "sigmoid": 2.5,
              "softplus": 3.5, "silu": 3.0, "silu_derivative": 3.0}
# silu' crosses zero at x ≈ −1.28, where any float32 formula cancels: its error is counted in
# ulps of max(|f(x)|, 1) instead.
ULP_FLOOR = {"silu_derivative": 1.0}


def ulp_errors(op: str, x: np.ndarray, y: np.ndarray, reference) -> np.ndarray:
    """|y − f(x)| in units of the float32 spacing at f(x) (or at ULP_FLOOR[op] if larger),
    over the op's domain with finite normal results."""
    lo, hi = DOMAINS[op]
    with np.errstate(all="ignore"):
        ref = reference(op, x.astype(np.float64))
    keep = np.isfinite(x) & (x > lo) & (x < hi) & np.isfinite(ref) & (np.abs(ref) >= np.finfo(np.float32).tiny) \
        & (np.abs(ref) <= np.finfo(np.float32).max)
    magnitude = np.maximum(np.abs(ref[keep]), ULP_FLOOR.get(op, 0.0))
    spacing = np.spacing(magnitude.astype(np.float32)).astype(np.float64)
    return np.abs(y[keep].astype(np.float64) - ref[keep]) / spacing
