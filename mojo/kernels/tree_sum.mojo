"""Partial sums combined in the row tree (engine.reduction.tree_reduce).

    out[i] = (out[i] +) T(partials[0][i], partials[1][i], …, partials[n−1][i])

T is the contiguous pairwise tree, T(0..n) = T(0..m) + T(m..n) with m the largest power of two below n; the
partials are one per packed row (a GEMM's k range, a column sum's chunk, an embedding row's tokens), so a
device holding an aligned block of rows computes a subtree, and the world's devices' subtrees combine to the
bits one device gets for all the rows (docs/mesh.md, "Identical across splits"). With `accumulate` the old
out[i] is added once, after the tree. No backward: the sum's gradient is the same value for every partial.
"""

from engine.launch import Args, Interface
from engine.reduction import tree_reduce

comptime TREE_SUM = Interface("out partials", "size count accumulate", "")


def tree_sum[w: SIMDLength](i: Int, args: Args):
    """Elements [i, i + w) of out from partials [count, size]: an element-wise kernel, each lane its own tree."""
    var out = args.f32(0)
    var partials = args.f32(1)
    var size = args.size(0)
    var count = args.size(1)

    def value(z: Int) {imm partials, imm size, imm i} -> SIMD[DType.float32, w]:
        return partials.unsafe_load[width=w](z * size + i)

    var total = tree_reduce[w](value, count)
    if args.flag(2):
        total = out.unsafe_load[width=w](i) + total
    out.unsafe_store(i, total)
