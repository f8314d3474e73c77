"""The canonical order of every long sum in the engine.

A sum over n values is taken in 32 lanes: lane l adds values l, l+32, l+64, …
in ascending order, then the lanes are folded by halves (l + l+16, then +8, +4,
+2, +1). One CPU thread or one GPU thread runs exactly this code, so the order
never depends on the thread schedule. Contractions inside GEMM and attention
(dot products) are instead sequential `fma` chains over the contraction index.
"""

from std.math import fma
from max.gpu.primitives.warp import shuffle_down, shuffle_idx
from engine.device import F32Ptr

comptime LANES = 32


@always_inline
def fold_lanes(acc: SIMD[DType.float32, LANES]) -> Float32:
    """Fold 32 partial sums by halves: the fixed tree every reduction ends with."""
    var v16 = acc.slice[16, offset=0]() + acc.slice[16, offset=16]()
    var v8 = v16.slice[8, offset=0]() + v16.slice[8, offset=8]()
    var v4 = v8.slice[4, offset=0]() + v8.slice[4, offset=4]()
    var v2 = v4.slice[2, offset=0]() + v4.slice[2, offset=2]()
    return v2[0] + v2[1]


@always_inline
def canonical_reduce[F: def(Int) -> Float32](value: F, n: Int) -> Float32:
    """Σ value(i) for i in [0, n) in the canonical order."""
    var acc = SIMD[DType.float32, LANES](0)
    var start = 0
    while start + LANES <= n:
        comptime for l in range(LANES):
            acc[l] += value(start + l)
        start += LANES
    for l in range(n - start):
        acc[l] += value(start + l)
    return fold_lanes(acc)


@always_inline
def row_reduce[warp: Bool, F: def(Int) -> Float32](value: F, n: Int, lane: Int) -> Float32:
    """Σ value(i) for i in [0, n) in the canonical order, taken by one caller (warp False, lane 0) or by the
    32 threads of a GPU warp (warp True), thread `lane` playing lane `lane`: it adds values lane, lane+32, …
    from +0, then the warp folds the lanes by shuffles in fold_lanes' tree (l + l+16, +8, +4, +2, +1) and every
    thread gets the total. Same operations, same order, so the same bits either way."""
    comptime if warp:
        var partial = Float32(0)
        for i in range(lane, n, LANES):
            partial += value(i)
        comptime for level in range(5):
            partial = partial + shuffle_down(partial, UInt32(16 >> level))
        return shuffle_idx(partial, 0)
    else:
        return canonical_reduce(value, n)


@always_inline
def row_stride[warp: Bool]() -> Int:
    """The step between the columns one caller of a row body writes: LANES in a warp, else 1."""
    return LANES if warp else 1


@always_inline
def canonical_sum(p: F32Ptr, n: Int) -> Float32:
    """Σ p[0:n] in the canonical order."""
    def value(i: Int) {imm p} -> Float32:
        return p.unsafe_load(i)

    return canonical_reduce(value, n)


@always_inline
def canonical_dot(a: F32Ptr, b: F32Ptr, n: Int) -> Float32:
    """Σ a[i]·b[i] in the canonical order (each product rounded, then added)."""
    def value(i: Int) {imm a, imm b} -> Float32:
        return a.unsafe_load(i) * b.unsafe_load(i)

    return canonical_reduce(value, n)


@always_inline
def fma_dot(a: F32Ptr, b: F32Ptr, n: Int) -> Float32:
    """Σ a[i]·b[i] as a contraction: one fma chain over i ascending from +0."""
    var total = Float32(0)
    for i in range(n):
        total = fma(a.unsafe_load(i), b.unsafe_load(i), total)
    return total


@always_inline
def row_max(p: F32Ptr, n: Int) -> Float32:
    """max p[0:n]; the order does not change a maximum, NaN aside."""
    var m = p.unsafe_load(0)
    for i in range(1, n):
        var x = p.unsafe_load(i)
        m = x if x > m else m
    return m
