"""Every engine kernel, callable on device buffers.

These are thin, checked wrappers over ``uform._engine``: they verify that the
buffers live on one device and have the shapes the kernel reads, then pass
addresses and sizes down. The trainers compose them; the tests call them on
numpy data through :func:`uform.Device.put` and :meth:`uform.Buffer.numpy`.
"""

from __future__ import annotations

import numpy as np

from .engine import Buffer, _engine

# Operation codes of the portable math (mojo/kernels/pointwise.mojo).
UNARY_OPS = {
    "exp": 0, "log": 1, "log1p": 2, "sqrt": 3, "rsqrt": 4,
    "sigmoid": 5, "softplus": 6, "silu": 7, "silu_derivative": 8,
}


def _device(*buffers: Buffer):
    device = buffers[0].device
    for buffer in buffers[1:]:
        if buffer.device is not device:
            raise ValueError(f"buffers live on different devices: {device.name} and {buffer.device.name}")
    return device


def _expect(buffer: Buffer, name: str, size: int, dtype=np.float32) -> None:
    if buffer.dtype != np.dtype(dtype):
        raise TypeError(f"{name} must be {np.dtype(dtype)}, got {buffer.dtype}")
    if buffer.size != size:
        raise ValueError(f"{name} must hold {size} values, holds {buffer.size} (shape {buffer.shape})")


def unary(op: str, y: Buffer, x: Buffer) -> None:
    """y = op(x) element-wise, with the engine's portable math (see UNARY_OPS)."""
    if op not in UNARY_OPS:
        raise ValueError(f"unknown unary op {op!r}; choose one of {sorted(UNARY_OPS)}")
    device = _device(y, x)
    _expect(y, "y", x.size)
    _engine.unary_math(device._handle, UNARY_OPS[op], x.size, y.address, x.address)


def silu_backward(dx: Buffer, x: Buffer, dy: Buffer) -> None:
    device = _device(dx, x, dy)
    _expect(dx, "dx", x.size)
    _expect(dy, "dy", x.size)
    _engine.silu_backward(device._handle, x.size, dx.address, x.address, dy.address)


def add(y: Buffer, a: Buffer, b: Buffer) -> None:
    device = _device(y, a, b)
    _expect(y, "y", a.size)
    _expect(b, "b", a.size)
    _engine.add(device._handle, a.size, y.address, a.address, b.address)


def scale(y: Buffer, x: Buffer, alpha: float) -> None:
    device = _device(y, x)
    _expect(y, "y", x.size)
    _engine.scale(device._handle, x.size, y.address, x.address, float(alpha))


def gemm(c: Buffer, a: Buffer, b: Buffer, m: int, n: int, k: int, *,
         transpose_a: bool = False, transpose_b: bool = False, accumulate: bool = False) -> None:
    """C[m×n] (+)= op(A)·op(B); A is m×k (k×m if transpose_a), B is k×n (n×k if transpose_b)."""
    if transpose_a and transpose_b:
        raise ValueError("gemm supports A·B, Aᵀ·B and A·Bᵀ, not Aᵀ·Bᵀ")
    device = _device(c, a, b)
    _expect(a, "A", m * k)
    _expect(b, "B", k * n)
    _expect(c, "C", m * n)
    _engine.gemm(device._handle, c.address, a.address, b.address, m, n, k,
                 bool(transpose_a), bool(transpose_b), bool(accumulate))
