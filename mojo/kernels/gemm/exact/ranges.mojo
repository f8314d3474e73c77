"""The exact GEMM over k ranges: a product per packed row, or block of rows, combined by the row tree.

The encoder's weight gradients sum over tokens by packed rows (docs/mesh.md): python/uform/kernels.py's k_range cuts an Aᵀ·B
product's k into ranges of one row's tokens, or of a block of rows where the rule takes a block's product
(uform.nn.transformer.weight_gradient_range), and each range is an exact product of its own (its lines' exponents
over its own elements, b from its own length), rounded once into a partial; the row tree (kernels/tree_sum.mojo)
then adds the partials. A device holding an aligned block of ranges computes a subtree of the same sum. On a GPU
with the fused kernel the ranges run together (one exponent pass, one residue pass and one fused launch whose
splits are the ranges, each block reconstructing its range's partial), where the ranges are equal and a whole
number of its stages; elsewhere one product per range.
"""

from std.collections import Array
from engine.device import F32Ptr, f32_at
from engine.launch import DevicePtr, launch_elements
from engine.target import HAS_HOPPER
from kernels.tree_sum import TreeSum, tree_sum
from kernels.gemm.exact.definition import bits_per_side, moduli_count
from kernels.gemm.exact.exponents import exponent_blocks, exponents_bytes
from kernels.gemm.exact.residues import joined_size, ranged_planes
from kernels.gemm.exact.forms import gemm_exact_residues_on, residue_workspace_bytes
from kernels.gemm.exact.fused_sm90 import FUSED_K, fused_products, fused_scratch_bytes, fused_splits


def ranged_together(K: Int, range_length: Int, gpu: Bool, fused: Bool) -> Bool:
    """Whether the ranges of k run together, in one fused launch: on a Hopper GPU, in the fused form, for equal
    ranges of whole stages."""
    comptime if not HAS_HOPPER:
        return False
    return gpu and fused and K % range_length == 0 and range_length % FUSED_K == 0


def partials_bytes(ranges: Int, M: Int, N: Int) -> Int:
    """Bytes of the ranges' float32 partials, rounded up to 256 so that, one range at a time, the planes after them
    keep the 16-byte alignment their vector stores and copies need (run together, the partials come last)."""
    return (4 * ranges * M * N + 255) // 256 * 256


def ranged_workspace_bytes(M: Int, N: Int, K: Int, range_length: Int, gpu: Bool, fused: Bool) -> Int:
    """Bytes of gemm_exact_ranges_on's workspace: the partials (float32, a range each) and, where the ranges run
    together (ranged_together), the planes of the whole k, the ranges' exponents, their partial maxima and the fused
    kernel's residues (ranges_fused's layout); else one range's residue workspace."""
    var ranges = (K + range_length - 1) // range_length
    var partials = partials_bytes(ranges, M, N)
    if ranged_together(K, range_length, gpu, fused):
        var moduli = moduli_count(range_length)
        return (moduli * (M + N) * K + exponents_bytes(ranges * M) + exponents_bytes(ranges * N)
                + exponents_bytes(exponent_blocks(K) * max(M, N))
                + fused_scratch_bytes(M, N, K, moduli, ranges, ranges=True) + partials)
    var last = K - (ranges - 1) * range_length
    return partials + max(residue_workspace_bytes(M, N, range_length, 0, gpu),
                          residue_workspace_bytes(M, N, last, 0, gpu))


def gemm_exact_ranges_on[transpose_a: Bool, transpose_b: Bool, fused: Bool](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, accumulate: Bool, workspace: Int,
    range_length: Int, a_ready: Bool = False,
) raises:
    """C (+)= T(P_0, P_1, …) with P_r the exact product of k range r ([r·L, min((r + 1)·L, K)), L = range_length)
    and T the row tree (then C0 added once, as the fma chain's k ranges do); `workspace` holds
    ranged_workspace_bytes(M, N, K, L, dev[].is_gpu(), fused). a_ready (gemm_exact_residues_on's): taken where the
    ranges run together (ranges_fused_on); one range at a time finds A's planes range by range anyway."""
    comptime if not transpose_a or transpose_b:
        raise Error("gemm_exact: k ranges are for Aᵀ·B products")
    if ranged_together(K, range_length, dev[].is_gpu(), fused):
        ranges_fused_on(dev, Array[F32Ptr, 1](fill=c), a, Array[F32Ptr, 1](fill=b), M, Array[Int, 1](fill=N), 1, K,
                        accumulate, workspace, range_length, a_ready)
        return
    var ranges = (K + range_length - 1) // range_length
    var partials = workspace
    var rest = workspace + partials_bytes(ranges, M, N)
    for r in range(ranges):
        var first = r * range_length
        var length = min(range_length, K - first)
        # a(m, k) at k·M + m and b(k, n) at k·N + n: range r's operands start at row `first`; the fused form at its
        # own split (never fused_pays' cuBLAS, which a recorded device graph cannot hold)
        gemm_exact_residues_on[True, False, fused](dev, f32_at(partials + 4 * r * M * N), a.unsafe_offset(first * M),
                                                   b.unsafe_offset(first * N), M, N, length, False, rest,
                                                   fused_splits(M, N, length, 0))
    tree_of_ranges(dev, c, partials, M, N, ranges, accumulate, N)


def tree_of_ranges(dev: DevicePtr, c: F32Ptr, partials: Int, M: Int, N: Int, ranges: Int, accumulate: Bool,
                   stride: Int) raises:
    """C (+)= the row tree over the ranges' partials of C's M × N outputs, C's rows `stride` floats apart in a
    partial (N; or the joined columns' total, `partials` at C's first column: ranges_fused_on)."""
    var sum = TreeSum(c, f32_at(partials), M * N, ranges, accumulate, 0 if stride == N else N, stride)
    launch_elements[tree_sum, gpu_lanes=1](dev, M * N, sum.args())  # its stack of partials a lane: 1 a GPU thread


def columns_joined(K: Int, range_length: Int, products: Int, gpu: Bool) -> Bool:
    """Whether gemm_exact_shared_a_on runs products of one A as one product of their B's columns joined
    (ranges_fused_on): several Aᵀ·B products whose k ranges run together (ranged_together), so that their blocks
    share the GPU's waves (the weight gradients of q, k and v over ranges of 4096 tokens: 576 blocks of 128 × 128
    each, 2.2 waves of 264 apiece; joined, 864 blocks of 128 × 256)."""
    return products > 1 and 0 < range_length < K and ranged_together(K, range_length, gpu, True)


def ranges_fused_on[terms: Int](
    dev: DevicePtr, c: Array[F32Ptr, terms], a: F32Ptr, b: Array[F32Ptr, terms], M: Int, N: Array[Int, terms],
    products: Int, K: Int, accumulate: Bool, workspace: Int, range_length: Int, a_ready: Bool,
) raises:
    """C_t (+)= the row tree over every range's exact product of Aᵀ·B_t, for the first `products` B_t, the ranges of
    all of them in one fused launch over their columns joined (ranges_fused), then the tree of each C_t's columns.
    A product's bits are its own whatever it is joined with: an output's exact sum, exponents and rounding are its
    row's and column's alone. `workspace` holds ranged_workspace_bytes of the joined M × (N_0 + N_1 + …) product."""
    comptime if HAS_HOPPER:
        var partials: Int
        if moduli_count(range_length) == 11:
            partials = ranges_fused[11](dev, a, b, M, N, products, K, range_length, workspace, a_ready)
        else:
            partials = ranges_fused[12](dev, a, b, M, N, products, K, range_length, workspace, a_ready)
        var total = joined_size(N, products)
        var first = 0
        for t in range(products):
            tree_of_ranges(dev, c[t], partials + 4 * first, M, N[t], K // range_length, accumulate, total)
            first += N[t]
    else:
        raise Error("gemm_exact: k ranges run together only on a Hopper GPU")


def ranges_fused[moduli: Int, terms: Int](
    dev: DevicePtr, a: F32Ptr, b: Array[F32Ptr, terms], M: Int, N: Array[Int, terms], products: Int, K: Int,
    range_length: Int, workspace: Int, a_ready: Bool,
) raises -> Int:
    """Every range's exact product of Aᵀ·B, B the first `products` B_t joined along their columns, together (GPU,
    fused kernel): the ranges' exponents and the planes of the whole k cut range by range (ranged_planes; A's unless
    a_ready), then one fused launch whose splits are the ranges, each block reconstructing its range's partial.
    Answers where the partials are (range r's M × (N_0 + N_1 + …) floats at r·M·(N_0 + N_1 + …)): after
    everything else, so that A's part comes first, whatever N."""
    var ranges = K // range_length
    var bits = bits_per_side(range_length)
    var columns = joined_size(N, products)
    var a_residues = workspace  # A's part first, as in residue_product
    var a_exponents = a_residues + moduli * M * K
    var b_residues = a_exponents + exponents_bytes(ranges * M)
    var b_exponents = b_residues + moduli * columns * K
    var maxima = b_exponents + exponents_bytes(ranges * columns)
    var residues = maxima + exponents_bytes(exponent_blocks(K) * max(M, columns))
    var partials = residues + fused_scratch_bytes(M, columns, K, moduli, ranges, ranges=True)
    if not a_ready:
        ranged_planes[moduli](dev, a_residues, a_exponents, maxima, Array[F32Ptr, 1](fill=a), Array[Int, 1](fill=M), 1,
                              K, bits, range_length)
    ranged_planes[moduli](dev, b_residues, b_exponents, maxima, b, N, products, K, bits, range_length)
    fused_products[moduli](dev, f32_at(partials), a_residues, b_residues, a_exponents, b_exponents, residues, M,
                           columns, K, bits, False, ranges, ranges=True)
    return partials
