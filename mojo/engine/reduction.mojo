"""The canonical order of every long sum in the engine.

A sum over n values is taken in 32 lanes: lane l adds values l, l+32, l+64, …
in ascending order, then the lanes are folded by halves (l + l+16, then +8, +4,
+2, +1). One CPU thread or one GPU thread runs exactly this code, so the order
never depends on the thread schedule. Contractions inside GEMM and attention
(dot products) are instead sequential `fma` chains over the contraction index.

Sums over the rows of a packed batch (the encoder's weight gradients, norm gains and
embedding table: one partial per row) are combined by `tree_reduce` instead, the
contiguous pairwise tree T(0..n) = T(0..m) + T(m..n), m the largest power of two below
n. Every aligned block of 2^j rows is a subtree, so devices holding such blocks can sum
their own rows and the blocks' sums then combine to the same bits (docs/mesh.md).
"""

from std.collections import Array
from std.math import fma
from max.gpu.primitives.warp import shuffle_down, shuffle_idx
from max.gpu.memory import AddressSpace
from engine.device import F32Ptr
from engine.numerics import INF

comptime LANES = 32


@always_inline
def fold_lanes(acc: SIMD[DType.float32, LANES]) -> Float32:
    """Fold 32 partial sums by halves: the fixed tree every reduction ends with."""
    return fold_halves(acc)


@always_inline
def fold_halves[n: SIMDLength, //](acc: SIMD[DType.float32, n]) -> Float32:
    """Fold n partial sums (a power of two) by halves, slot t + slot t + n/2 until one is left: fold_lanes' tree
    from any of its levels (a GPU block's warps that each hold some of its slots fold the rest with it)."""
    comptime if n == 1:
        return acc[0]
    else:
        return fold_halves(acc.slice[n // 2, offset=0]() + acc.slice[n // 2, offset=n // 2]())


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
def canonical_reduce_lanes[w: SIMDLength, F: def(Int) -> SIMD[DType.float32, w]](
    value: F, n: Int
) -> SIMD[DType.float32, w]:
    """w sums at once, Σ value(i)[lane] for i in [0, n): each lane exactly canonical_reduce's order (32 strided
    partial sums, then folded by halves), so each lane's bits are those of canonical_reduce on it alone."""
    var acc = Array[SIMD[DType.float32, w], LANES](fill=SIMD[DType.float32, w](0))
    var start = 0
    while start + LANES <= n:
        comptime for l in range(LANES):
            acc[l] += value(start + l)
        start += LANES
    for l in range(n - start):
        acc[l] += value(start + l)
    comptime for level in range(5):
        comptime for l in range(16 >> level):
            acc[l] = acc[l] + acc[l + (16 >> level)]
    return acc[0]


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
def fma_dot[width: Int = 1, space: AddressSpace = AddressSpace.GENERIC](
    a: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    b: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    n: Int,
) -> Float32:
    """Σ a[i]·b[i] as a contraction: one fma chain over i ascending from +0. With `width` > 1 each row is loaded
    `width` values at a time (n a multiple of it, both rows on 16 bytes), so that a run's loads are in flight
    together: the same chain, so the same bits."""
    comptime alignment = 16 if width >= 4 else 4 * width
    var total = Float32(0)
    for c in range(0, n, width):
        var x = a.unsafe_load[width=width, alignment=alignment](c)
        var y = b.unsafe_load[width=width, alignment=alignment](c)
        comptime for j in range(width):
            total = fma(x[j], y[j], total)
    return total


@always_inline
def row_max(p: F32Ptr, n: Int) -> Float32:
    """max p[0:n]; the order does not change a maximum, NaN aside."""
    var m = p.unsafe_load(0)
    for i in range(1, n):
        var x = p.unsafe_load(i)
        m = x if x > m else m
    return m


@always_inline
def row_max_of[warp: Bool](p: F32Ptr, n: Int, lane: Int) -> Float32:
    """row_max(p, n), taken by one caller (warp False, lane 0) or by the 32 threads of a GPU warp (warp True),
    every thread getting it. row_max answers p[0] when that is a NaN, else the largest of the other values (a
    NaN later never compares greater); so does the warp: lane 0 starts from p[0] and every other lane from −∞,
    each keeps the larger of what it reads, and the lanes fold into lane 0 always on the left, so only p[0]'s NaN
    survives. Ties between +0 and −0 may keep the other zero, which no caller tells apart (x − m, log Σ + m)."""
    comptime if warp:
        var m = p.unsafe_load(0) if lane == 0 else -INF
        for i in range(lane, n, LANES):
            var x = p.unsafe_load(i)
            m = x if x > m else m
        comptime for level in range(5):
            var other = shuffle_down(m, UInt32(16 >> level))
            m = other if other > m else m
        return shuffle_idx(m, 0)
    else:
        return row_max(p, n)


comptime TREE_DEPTH = 64  # partial sums a tree_reduce holds at once: enough for 2^63 values
comptime TREE_CHUNK = 8  # values tree_reduce reads at once and adds in registers: an aligned block of the tree


@always_inline
def tree_reduce[w: SIMDLength, F: def(Int) -> SIMD[DType.float32, w]](value: F, n: Int) -> SIMD[DType.float32, w]:
    """Σ value(i) for i in [0, n) (n ≥ 1) as the contiguous pairwise tree (the module doc), by a binary counter:
    after value(i) is pushed, the stack holds the sums of the aligned blocks that make up [0, i], largest first
    (the set bits of i + 1); each trailing one bit of i merges the new value with the block below it. At the
    end the blocks fold from the smallest: T(0..n) = B_0 + (B_1 + (… + B_last)), which is the tree's split.
    The w lanes are w independent sums, each exactly as w = 1 computes it (the CPU takes 8 outputs a call).
    Whole aligned blocks of TREE_CHUNK values are read at once and summed in registers, their own pairwise tree,
    then pushed as one value with the block's index as the counter: the merges pushing them one by one would
    make, in the same order. So the stack (which a GPU keeps in local memory: it is indexed at run time) is
    touched once a block, and a block's reads are in flight together."""
    # uninitialized: every entry is written before it is read, and filling it was a loop of byte stores to local
    # memory on a GPU (256 a thread at w = 1, 1024 at w = 4), more traffic than the partials it sums
    var stack = Array[SIMD[DType.float32, w], TREE_DEPTH](uninitialized=True)
    var depth = 0

    @always_inline
    def push(x: SIMD[DType.float32, w], counter: Int) {mut stack, mut depth}:
        var merged = x
        var bits = counter
        while bits & 1:
            depth -= 1
            merged = stack[depth] + merged
            bits >>= 1
        stack[depth] = merged
        depth += 1

    comptime assert TREE_CHUNK == 1 << 3, "a block's tree below takes three levels"
    var blocks = n // TREE_CHUNK
    for block in range(blocks):
        var v = Array[SIMD[DType.float32, w], TREE_CHUNK](fill=0)
        comptime for j in range(TREE_CHUNK):
            v[j] = value(block * TREE_CHUNK + j)
        comptime for level in range(1, 4):  # TREE_CHUNK = 2^3: pairs, then quads, then the block
            comptime for j in range(TREE_CHUNK >> level):
                v[j] = v[2 * j] + v[2 * j + 1]
        push(v[0], block)
    for i in range(blocks * TREE_CHUNK, n):
        push(value(i), i)
    var total = stack[depth - 1]
    for level in range(depth - 2, -1, -1):
        total = stack[level] + total
    return total
