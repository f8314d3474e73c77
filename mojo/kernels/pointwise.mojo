"""Element-wise kernels: the portable math over arrays, SiLU, residual adds, scaling.

    y = f(x)            unary_math   (op picks exp, log, log1p, sqrt, rsqrt, sigmoid, softplus, silu)
    y = silu(x)         silu_forward
    dx = dy·silu'(x)    silu_backward
    y = a + b           add
    y = α·x             scale
"""

from std.python import PythonObject
from max.gpu import global_idx
from engine.device import F32Ptr, f32_at
from engine.launch import GPU_BLOCK, gpu_blocks, cpu_parallel_for, device_of
from engine.target import HAS_ACCELERATOR
from engine import numerics


# Operation codes of `unary_math`, mirrored in python/uform/engine.py.
comptime OP_EXP = 0
comptime OP_LOG = 1
comptime OP_LOG1P = 2
comptime OP_SQRT = 3
comptime OP_RSQRT = 4
comptime OP_SIGMOID = 5
comptime OP_SOFTPLUS = 6
comptime OP_SILU = 7
comptime OP_SILU_DERIVATIVE = 8


@always_inline
def unary(op: Int, x: Float32) -> Float32:
    if op == OP_EXP:
        return numerics.exp(x)
    if op == OP_LOG:
        return numerics.log(x)
    if op == OP_LOG1P:
        return numerics.log1p(x)
    if op == OP_SQRT:
        return numerics.sqrt_rn(x)
    if op == OP_RSQRT:
        return numerics.rsqrt(x)
    if op == OP_SIGMOID:
        return numerics.sigmoid(x)
    if op == OP_SOFTPLUS:
        return numerics.softplus(x)
    if op == OP_SILU:
        return numerics.silu(x)
    return numerics.silu_derivative(x)


# ---- body: one element ---------------------------------------------------------------

@always_inline
def pointwise_element(kind: Int, op: Int, i: Int, y: F32Ptr, a: F32Ptr, b: F32Ptr, alpha: Float32):
    """kind 0: y = unary(op, a); 1: y = b·silu'(a); 2: y = a + b; 3: y = α·a."""
    var x = a.unsafe_load(i)
    if kind == 0:
        y.unsafe_store(i, unary(op, x))
    elif kind == 1:
        y.unsafe_store(i, b.unsafe_load(i) * numerics.silu_derivative(x))
    elif kind == 2:
        y.unsafe_store(i, x + b.unsafe_load(i))
    else:
        y.unsafe_store(i, alpha * x)


def pointwise_gpu(kind: Int64, op: Int64, n: Int64, y: F32Ptr, a: F32Ptr, b: F32Ptr, alpha: Float32):
    var i = Int(global_idx.x)
    if i < Int(n):
        pointwise_element(Int(kind), Int(op), i, y, a, b, alpha)


def pointwise(kind: Int, op: Int, device: PythonObject, n: Int, y: Int, a: Int, b: Int, alpha: Float32) raises:
    var dev = device_of(device)
    var yp = f32_at(y)
    var ap = f32_at(a)
    var bp = f32_at(b)
    if dev[].is_gpu():
        comptime if HAS_ACCELERATOR:
            dev[].ctx().enqueue_function[pointwise_gpu](
                Int64(kind), Int64(op), Int64(n), yp, ap, bp, alpha, grid_dim=gpu_blocks(n), block_dim=GPU_BLOCK
            )
        return

    def chunk(begin: Int, end: Int) {imm kind, imm op, imm yp, imm ap, imm bp, imm alpha}:
        for i in range(begin, end):
            pointwise_element(kind, op, i, yp, ap, bp, alpha)

    cpu_parallel_for(chunk, n)


# ---- Python entry points ----------------------------------------------------------------

def unary_math(device: PythonObject, op: PythonObject, n: PythonObject, y: PythonObject, x: PythonObject) raises -> PythonObject:
    pointwise(0, Int(py=op), device, Int(py=n), Int(py=y), Int(py=x), Int(py=x), 0)
    return PythonObject(None)


def silu_forward(device: PythonObject, n: PythonObject, y: PythonObject, x: PythonObject) raises -> PythonObject:
    pointwise(0, OP_SILU, device, Int(py=n), Int(py=y), Int(py=x), Int(py=x), 0)
    return PythonObject(None)


def silu_backward(device: PythonObject, n: PythonObject, dx: PythonObject, x: PythonObject, dy: PythonObject) raises -> PythonObject:
    pointwise(1, 0, device, Int(py=n), Int(py=dx), Int(py=x), Int(py=dy), 0)
    return PythonObject(None)


def add(device: PythonObject, n: PythonObject, y: PythonObject, a: PythonObject, b: PythonObject) raises -> PythonObject:
    pointwise(2, 0, device, Int(py=n), Int(py=y), Int(py=a), Int(py=b), 0)
    return PythonObject(None)


def scale(device: PythonObject, n: PythonObject, y: PythonObject, x: PythonObject, alpha: PythonObject) raises -> PythonObject:
    pointwise(3, 0, device, Int(py=n), Int(py=y), Int(py=x), Int(py=x), Float32(py=alpha))
    return PythonObject(None)
