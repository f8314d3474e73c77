"""The residue form's products: the passes in order, and the forms a call selects.

One product runs each operand's line exponents (exponents.mojo), its residue planes (residues.mojo), the plane
products and the reconstruction (crt.mojo). The plane products are one strided batched cuBLAS int8 GEMM a chunk of
k (plane_products_on_tensor_cores), or in the fused form the plane products and the reconstruction as one kernel
(fused_sm90.mojo); the CPU runs the same exponent passes and reconstruction over its own moduli (cpu_wide.mojo).
`gemm_exact_residues_on` is one product; `gemm_exact_shared_a_on` products of one A apart (its planes found
once), `gemm_exact_summed_on` one product over several terms joined along k; the workspace queries size each.
"""

from std.collections import Array
from engine.device import F32Ptr
from engine.launch import DevicePtr
from engine.target import HAS_ACCELERATOR, HAS_HOPPER, HAS_NVIDIA
from _cublas.cublas import Algorithm, ComputeType, check_cublas_error, cublasGemmStridedBatchedEx, cublasOperation_t
from _cublas.dtype import DataType
from linalg.matmul.vendor.blas import _get_global_handle
from kernels.gemm.exact.definition import MAX_K, bits_per_side, moduli_count
from kernels.gemm.exact.exponents import exponent_blocks, exponents_bytes
from kernels.gemm.exact.residues import Joined, RESIDUE_CHUNK, joined_planes, one_term, padded
from kernels.gemm.exact.crt import reconstruct
from kernels.gemm.exact.fused_sm90 import fused_pays, fused_products, fused_scratch_bytes, fused_splits
from kernels.gemm.exact.ranges import columns_joined, gemm_exact_ranges_on, ranges_fused_on
from kernels.gemm.exact.cpu_wide import WIDE_COUNT, wide_residue_product


def residue_workspace_bytes(M: Int, N: Int, K: Int, splits: Int, gpu: Bool) -> Int:
    """Bytes of the residue form's workspace: the residue planes (int8 on a GPU, int16 on the CPU) and the exponents
    (exponents_bytes) of both operands, the plane products' sums and the partial maxima of a transposed operand's
    lines (`splits` as gemm_exact_residues_on takes it; on a GPU in residue_product's order, A's part first)."""
    return joined_workspace_bytes(M, N, one_term(K), splits, gpu)


def joined_workspace_bytes[terms: Int](M: Int, N: Int, k: Joined[terms], splits: Int, gpu: Bool) -> Int:
    """residue_workspace_bytes for operands joined along k (Joined): the planes' lines as long as their k extent, the
    partial maxima of every term's lines."""
    var K = k.extent
    var planes: Int
    if gpu:
        planes = moduli_count(k.total) * (M + N) * padded(K) + sums_bytes(M, N, K, splits)
    else:
        planes = 2 * WIDE_COUNT * (M + N) * padded(K) + 4 * WIDE_COUNT * M * N
    return planes + exponents_bytes(M) + exponents_bytes(N) + 4 * max(M, N) * k.exponent_blocks()


def sums_bytes(M: Int, N: Int, K: Int, splits: Int) -> Int:
    """Bytes of the unfused form's int32 chunk sums, which also hold the fused kernel's byte residues."""
    var moduli = moduli_count(K)
    var chunks = (K + RESIDUE_CHUNK - 1) // RESIDUE_CHUNK
    return max(4 * moduli * chunks * M * N, fused_scratch_bytes(M, N, K, moduli, fused_splits(M, N, K, splits)))


def gemm_exact_residues_on[transpose_a: Bool, transpose_b: Bool, fused: Bool = False](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, accumulate: Bool, workspace: Int,
    splits: Int = 0, range_length: Int = 0, a_ready: Bool = False,
) raises:
    """The exact product through residues (the same bits as gemm_exact_on); `workspace` holds
    residue_workspace_bytes(M, N, K, splits, dev[].is_gpu()). With `fused`, a GPU runs the plane products and the
    reconstruction in the fused kernel (exact_fused_tile; k split into fused_splits(M, N, K, splits) ranges, 0 its
    own choice) where fused_pays, else the unfused form; the CPU runs its own residue form either way
    (wide_residue_product: the same bits). A positive range_length below K (Aᵀ·B only) cuts k into ranges, a
    product each, combined by the row tree (gemm_exact_ranges_on; the workspace then holds
    ranged_workspace_bytes). a_ready: the workspace already holds A's planes and exponents, as the previous product
    of the same A, layout, M, K and range_length left them (A's part of the workspace comes first, whatever N): a
    GPU then skips them where it finds them for the whole product at once (unranged, or ranges run together:
    gemm_exact_shared_a_on); the CPU, and ranges one at a time, find them again."""
    if (range_length if 0 < range_length < K else K) > MAX_K:
        raise Error("gemm_exact: k = ", K, " (in ranges of ", range_length, ") passes the definition's ", MAX_K)
    if 0 < range_length < K:
        gemm_exact_ranges_on[transpose_a, transpose_b, fused](dev, c, a, b, M, N, K, accumulate, workspace,
                                                               range_length, a_ready)
    elif not dev[].is_gpu():
        wide_residue_product[transpose_a, transpose_b](dev, c, Array[F32Ptr, 1](fill=a), Array[F32Ptr, 1](fill=b), M,
                                                       N, one_term(K), accumulate, workspace)
    else:
        moduli_residue_product[transpose_a, transpose_b, fused](dev, c, Array[F32Ptr, 1](fill=a),
                                                                Array[F32Ptr, 1](fill=b), M, N, one_term(K),
                                                                accumulate, workspace, splits, a_ready)


def gemm_exact_shared_a_on[transpose_a: Bool, transpose_b: Bool, terms: Int](
    dev: DevicePtr, c: Array[F32Ptr, terms], a: F32Ptr, b: Array[F32Ptr, terms], M: Int, N: Array[Int, terms],
    products: Int, K: Int, accumulate: Bool, workspace: Int, range_length: Int,
) raises:
    """The first `products` of up to `terms` exact products of one A, C_t (+)= op(A)·op(B_t) (q, k and v of one
    input; their weight gradients by rows), each with the bits the identical GEMM gives it alone (the fused form at
    its own split of k), A's residue planes found once on a GPU; where their k ranges run together, as one product
    of their columns joined (columns_joined). `workspace` holds uform_engine's gemm_shared_a_workspace."""
    if columns_joined(K, range_length, products, dev[].is_gpu()):
        comptime if transpose_a and not transpose_b:
            ranges_fused_on(dev, c, a, b, M, N, products, K, accumulate, workspace, range_length, False)
            return
    for t in range(products):
        gemm_exact_residues_on[transpose_a, transpose_b, fused=True](
            dev, c[t], a, b[t], M, N[t], K, accumulate, workspace, fused_splits(M, N[t], K, 0), range_length, t > 0
        )


def gemm_exact_summed_on[transpose_a: Bool, transpose_b: Bool, terms: Int](
    dev: DevicePtr, c: F32Ptr, a: Array[F32Ptr, terms], b: Array[F32Ptr, terms], M: Int, N: Int,
    k: Array[Int, terms], count: Int, accumulate: Bool, workspace: Int,
) raises:
    """C (+)= op(A_0)·op(B_0) + op(A_1)·op(B_1) + … for the first `count` terms as one exact product, of A_0 | A_1 | …
    joined along k by B_0 over B_1 over …: k = k_0 + k_1 + …, each line's exponent over all its terms, one rounding
    (the input's gradient through q, k and v). On a GPU the fused form at its own split; `workspace` holds
    summed_workspace_bytes(M, N, k, count, dev[].is_gpu())."""
    var joined = Joined[terms](k, count)
    if joined.extent > MAX_K:  # the total, and the padding, which the chunk sums' bounds count too
        raise Error("gemm_exact: joined k = ", joined.total, " (", joined.extent, " padded) passes ", MAX_K)
    if not dev[].is_gpu():
        wide_residue_product[transpose_a, transpose_b](dev, c, a, b, M, N, joined, accumulate, workspace)
        return
    moduli_residue_product[transpose_a, transpose_b, True](dev, c, a, b, M, N, joined, accumulate, workspace,
                                                           fused_splits(M, N, joined.extent, 0), False)


def summed_workspace_bytes[terms: Int](M: Int, N: Int, k: Array[Int, terms], count: Int, gpu: Bool) -> Int:
    """Bytes of gemm_exact_summed_on's workspace."""
    var joined = Joined[terms](k, count)
    return joined_workspace_bytes(M, N, joined, fused_splits(M, N, joined.extent, 0), gpu)


def moduli_residue_product[transpose_a: Bool, transpose_b: Bool, fused: Bool, terms: Int](
    dev: DevicePtr, c: F32Ptr, a: Array[F32Ptr, terms], b: Array[F32Ptr, terms], M: Int, N: Int, k: Joined[terms],
    accumulate: Bool, workspace: Int, splits: Int, a_ready: Bool,
) raises:
    """residue_product with the moduli the definition takes for k (moduli_count of its total: 11 or 12)."""
    if moduli_count(k.total) == 11:
        residue_product[11, transpose_a, transpose_b, fused](dev, c, a, b, M, N, k, accumulate, workspace, splits,
                                                             a_ready)
    else:
        residue_product[12, transpose_a, transpose_b, fused](dev, c, a, b, M, N, k, accumulate, workspace, splits,
                                                             a_ready)


def residue_product[moduli: Int, transpose_a: Bool, transpose_b: Bool, fused: Bool, terms: Int](
    dev: DevicePtr, c: F32Ptr, a: Array[F32Ptr, terms], b: Array[F32Ptr, terms], M: Int, N: Int, k: Joined[terms],
    accumulate: Bool, workspace: Int, splits: Int, a_ready: Bool,
) raises:
    """gemm_exact_residues_on on a GPU, for a k whose definition takes `moduli` moduli: the planes (A's unless
    a_ready), their products on the tensor cores, the reconstruction (with `fused`, the last two in one kernel).
    With several terms (gemm_exact_summed_on), the product of their operands joined along k."""
    var bits = bits_per_side(k.total)
    var K = k.extent
    var a_residues = workspace  # A's part first, so that products of one A and any N find it at the same place
    var a_exponents = a_residues + moduli * M * padded(K)
    var b_residues = a_exponents + exponents_bytes(M)
    var b_exponents = b_residues + moduli * N * padded(K)
    var sums = b_exponents + exponents_bytes(N)
    var partial = sums + sums_bytes(M, N, K, splits)
    if not a_ready:
        joined_planes[moduli, terms](dev, a_residues, a_exponents, partial, a, M, k, not transpose_a, bits)
    joined_planes[moduli, terms](dev, b_residues, b_exponents, partial, b, N, k, transpose_b, bits)
    comptime if HAS_ACCELERATOR:
        comptime if fused and HAS_HOPPER:  # elsewhere the unfused form: the same bits
            if fused_pays(M, N, K, splits):
                fused_products[moduli](dev, c, a_residues, b_residues, a_exponents, b_exponents, sums, M, N, K,
                                       bits, accumulate, fused_splits(M, N, K, splits))
                return
        comptime if HAS_NVIDIA:
            plane_products_on_tensor_cores(dev, sums, a_residues, b_residues, M, N, K, moduli)
        else:
            raise Error("gemm_exact: the residue form's plane products run on cuBLAS: not in this build")
    reconstruct[moduli, False](dev, c, sums, a_exponents, b_exponents, M, N, K, bits, accumulate)


def plane_products_on_tensor_cores(
    dev: DevicePtr, sums: Int, a_residues: Int, b_residues: Int, M: Int, N: Int, K: Int, moduli: Int
) raises:
    """The plane products' chunk sums by cuBLAS's int8 GEMM with int32 accumulation (exact): per chunk of k, one
    strided batched call over the moduli, S_i[m, n] = Σ_k a_i[m, k]·b_i[n, k], which in cuBLAS's column-major terms
    is S_iᵀ = B_i·A_iᵀ, the "TN" form its int8 kernels take (line lengths padded to 16 bytes)."""
    var handle = _get_global_handle[DType.int8](dev[].ctx())._get_cublas()
    var stride = padded(K)
    var chunks = (K + RESIDUE_CHUNK - 1) // RESIDUE_CHUNK
    var one = Int32(1)
    var zero = Int32(0)
    var alpha = Pointer[NoneType, ImmutAnyOrigin](unsafe_from_address=Int(UnsafePointer(to=one)))
    var beta = Pointer[NoneType, ImmutAnyOrigin](unsafe_from_address=Int(UnsafePointer(to=zero)))
    for chunk in range(chunks):
        var first = chunk * RESIDUE_CHUNK
        var length = min(stride, first + RESIDUE_CHUNK) - first
        var a = a_residues + first
        var b = b_residues + first
        var s = sums + 4 * chunk * M * N
        check_cublas_error(cublasGemmStridedBatchedEx(
            handle, cublasOperation_t.CUBLAS_OP_T, cublasOperation_t.CUBLAS_OP_N, Int64(N), Int64(M),
            Int64(length), alpha,
            Pointer[NoneType, ImmutAnyOrigin](unsafe_from_address=b), DataType.R_8I, Int64(stride), Int64(N * stride),
            Pointer[NoneType, ImmutAnyOrigin](unsafe_from_address=a), DataType.R_8I, Int64(stride), Int64(M * stride),
            beta, Pointer[NoneType, MutAnyOrigin](unsafe_from_address=s), DataType.R_32I, Int64(N),
            Int64(chunks * M * N), Int64(moduli), ComputeType.COMPUTE_32I, Algorithm.DEFAULT,
        ), msg="gemm_exact: cuBLAS's int8 products")
