"""Fast mode's GEMM: C = op(A)·op(B), or C += op(A)·op(B), on the tensor cores in bf16.

    C[m, n] = C0[m, n] + Σ_k bf16(a(m, k))·bf16(b(k, n))      (C0 = 0 unless accumulating)

bf16(x) rounds an fp32 value to the nearest bfloat16 (ties to even). The products and their sum
are taken in fp32 by cuBLAS (`CUBLAS_COMPUTE_32F`), written to the fp32 C. Operands and layouts
are those of the identical GEMM (kernels/gemm/fma.mojo): the trainers keep fp32 master weights, and
fp32 activations except those that only GEMMs read, so `cast_bf16` writes bf16 copies of A and B
(into a workspace, or once into a copy the caller keeps and passes to every product that reads
that operand, unless the operand's producer wrote that copy: kernels/fast_producers.mojo), then
MAX's vendor-BLAS binding runs cuBLAS on the device's stream. cuBLAS chooses its algorithm by shape and
GPU model, and by its documentation gives the same bits on every run on GPUs of one architecture
and SM count: fast mode is deterministic on one GPU model, never equal to the CPU's identical bits.

GPU only: on the CPU, fast mode runs the identical GEMM (python/uform/kernels.py decides).
"""

from layout import Coord, TileTensor, row_major
from linalg.matmul.vendor.blas import matmul as vendor_matmul
from engine.device import F32Ptr
from engine.launch import Args, DevicePtr, Interface, launch_index
from engine.target import HAS_ACCELERATOR

comptime BF16Ptr = UnsafePointer[BFloat16, MutAnyOrigin]
comptime CAST_LANES = 8  # values rounded by one task: 16 bytes of bf16 written at once
comptime WORKSPACE_ALIGNMENT = 8  # bf16 values: each copy starts on a 16-byte boundary, as cuBLAS prefers


def bf16_values(count: Int) -> Int:
    """bf16 slots one operand's copy takes in the workspace (rounded up to the alignment)."""
    return (count + WORKSPACE_ALIGNMENT - 1) // WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT


def workspace_bytes(M: Int, N: Int, K: Int) -> Int:
    """Bytes of the workspace an M×N×K product needs to round both operands itself: their bf16 copies."""
    return 2 * (bf16_values(M * K) + bf16_values(K * N))


comptime CAST_BF16 = Interface("y x", "count", "")


def cast_bf16(i: Int, args: Args):
    """y[j] = bf16(x[j]) for j in [CAST_LANES·i, CAST_LANES·i + CAST_LANES) ∩ [0, count); y holds bf16 values.
    A whole group whose operands are 32-byte (x) and 16-byte (y) aligned moves as two 16-byte loads and one
    16-byte store; any other group value by value."""
    var y = BF16Ptr(unsafe_from_address=Int(args.addresses[0]))
    var x = args.f32(1)
    var count = args.size(0)
    var first = i * CAST_LANES
    if first + CAST_LANES <= count and (Int(x) % 32 == 0) and (Int(y) % 16 == 0):
        var values = x.unsafe_load[width=CAST_LANES, alignment=32](first)
        y.unsafe_store[width=CAST_LANES, alignment=16](first, values.cast[DType.bfloat16]())
    else:
        for j in range(first, min(first + CAST_LANES, count)):
            y.unsafe_store(j, x.unsafe_load(j).cast[DType.bfloat16]())


def cast_tasks(count: Int) -> Int:
    """Tasks of a cast of `count` values."""
    return (count + CAST_LANES - 1) // CAST_LANES


def cast_to_bf16(dev: DevicePtr, y: Int, x: F32Ptr, count: Int) raises:
    var args = Args.empty()  # CAST_BF16
    args.addresses[0] = Int64(y)
    args.addresses[1] = Int64(Int(x))
    args.sizes[0] = Int64(count)
    launch_index[cast_bf16](dev, cast_tasks(count), args)


def gemm_fast_on[transpose_a: Bool, transpose_b: Bool](
    dev: DevicePtr, c: F32Ptr, a: F32Ptr, b: F32Ptr, M: Int, N: Int, K: Int, accumulate: Bool, a16: Int, b16: Int,
    workspace: Int,
) raises:
    """The product in bf16 on a GPU. a16 and b16: the addresses of A's and B's bf16 copies, or 0 to round them
    here into `workspace` (workspace_bytes: A's copy first, then B's)."""
    comptime if HAS_ACCELERATOR:
        if not dev[].is_gpu():
            raise Error("gemm_fast: fast mode's GEMM runs on a GPU; the CPU runs the identical GEMM")
        var a_copy = a16
        var b_copy = b16
        if a_copy == 0:
            a_copy = workspace
            cast_to_bf16(dev, a_copy, a, M * K)
        if b_copy == 0:
            b_copy = workspace + 2 * bf16_values(M * K)
            cast_to_bf16(dev, b_copy, b, K * N)
        var c_tensor = TileTensor(UnsafePointer[Float32, MutAnyOrigin](unsafe_from_address=Int(c)),
                                  row_major(Coord(M, N)))
        var a_rows = K if transpose_a else M
        var b_rows = N if transpose_b else K
        var a_tensor = TileTensor(BF16Ptr(unsafe_from_address=a_copy), row_major(Coord(a_rows, M * K // a_rows)))
        var b_tensor = TileTensor(BF16Ptr(unsafe_from_address=b_copy), row_major(Coord(b_rows, K * N // b_rows)))
        vendor_matmul(dev[].ctx(), c_tensor, a_tensor, b_tensor, c_row_major=True, transpose_a=transpose_a,
                      transpose_b=transpose_b, beta=Float32(1.0) if accumulate else Float32(0.0))
    else:
        raise Error("gemm_fast: this engine variant was built without accelerator code")
