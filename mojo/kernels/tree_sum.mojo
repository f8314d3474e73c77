"""Partial sums combined in the row tree (engine.reduction.tree_reduce).

    out[i] = (out[i] +) T(partials[0][i], partials[1][i], …, partials[n−1][i])

T is the contiguous pairwise tree, T(0..n) = T(0..m) + T(m..n) with m the largest power of two below n; the
partials are one per packed row (a GEMM's k range, a column sum's chunk, an embedding row's tokens), so a
device holding an aligned block of rows computes a subtree, and the world's devices' subtrees combine to the
bits one device gets for all the rows (docs/mesh.md, "Identical across splits"). With `accumulate` the old
out[i] is added once, after the tree. No backward: the sum's gradient is the same value for every partial.
"""

from engine.device import F32Ptr
from engine.launch import Args, Interface
from engine.reduction import tree_reduce

comptime TREE_SUM = Interface("out partials", "size count accumulate columns stride", "")


@fieldwise_init
struct TreeSum(ImplicitlyCopyable, Movable):
    """tree_sum's operands: `count` partials of out's `size` values, side by side; or, with `columns` > 0, partials
    whose rows of `stride` floats each begin with one of out's rows of `columns` (a product of several joined along
    their columns: each partial a range's M × (N_0 + N_1 + …) outputs, out one product's M × N_t, `partials` at its
    first column; kernels/gemm/exact/ranges.mojo, tree_of_ranges). A vector of w outputs stays in one row: columns a multiple of w (the
    GPU's lanes take one output each)."""

    var out: F32Ptr
    var partials: F32Ptr
    var size: Int
    var count: Int
    var accumulate: Bool
    var columns: Int
    var stride: Int

    @always_inline
    def __init__(out self, args: Args):
        self.out = args.f32(0)
        self.partials = args.f32(1)
        self.size = args.size(0)
        self.count = args.size(1)
        self.accumulate = args.flag(2)
        self.columns = args.size(3)
        self.stride = args.size(4)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.out))
        args.addresses[1] = Int64(Int(self.partials))
        args.sizes[0] = Int64(self.size)
        args.sizes[1] = Int64(self.count)
        args.sizes[2] = Int64(1 if self.accumulate else 0)
        args.sizes[3] = Int64(self.columns)
        args.sizes[4] = Int64(self.stride)
        return args


def tree_sum[w: SIMDLength](i: Int, args: Args):
    """Elements [i, i + w) of out from the partials (TreeSum): an element-wise kernel, each lane its own tree."""
    var sum = TreeSum(args)
    var partials = sum.partials
    var at = i  # where output i lies in a partial, and how far apart the partials are
    var apart = sum.size
    if sum.columns > 0:
        at = i // sum.columns * sum.stride + i % sum.columns
        apart = sum.size // sum.columns * sum.stride

    def value(z: Int) {imm partials, imm apart, imm at} -> SIMD[DType.float32, w]:
        return partials.unsafe_load[width=w](z * apart + at)

    var total = tree_reduce[w](value, sum.count)
    if sum.accumulate:
        total = sum.out.unsafe_load[width=w](i) + total
    sum.out.unsafe_store(i, total)
