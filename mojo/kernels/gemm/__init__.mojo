"""The GEMMs: C[M×N] (+)= op(A)·op(B) in each numeric form, and the identical GEMM's dispatch.

- fma.mojo: the fma chain, the identical GEMM below the shape rule (and the fma-only `gemm_fma`);
- exact/: the exact GEMM, the identical GEMM where the rule takes a product;
- fast.mojo: fast mode's bf16 product on cuBLAS.

This file decides, once for the engine and for Python (python/uform/kernels.py asks it through the bindings):
which form the identical GEMM runs for a shape (`exact_applies`), which form a group of products runs
(`group_form`), and the bytes of workspace each needs. A call's operands travel to its launcher in Args slots
(`ProductCall`, `GroupSlots`), as every kernel's operands do.
"""

from std.collections import Array
from engine.device import F32Ptr, f32_at
from engine.launch import Args, DevicePtr
from kernels.gemm.fast import gemm_fast_on
from kernels.gemm.fma import GROUP_TERMS, gemm_group_on, gemm_on, k_chunks
from kernels.gemm.exact.definition import MAX_K, gemm_exact_on, workspace_bytes
from kernels.gemm.exact.forms import (
    gemm_exact_residues_on, gemm_exact_shared_a_on, gemm_exact_summed_on, residue_workspace_bytes,
    summed_workspace_bytes,
)
from kernels.gemm.exact.fused_sm90 import fused_splits
from kernels.gemm.exact.ranges import columns_joined, ranged_workspace_bytes

comptime Terms = Array[Int, GROUP_TERMS]
"""A value per product of a group (its C, A or B address, or its varying size), zeros past the group's terms."""
comptime EXACT_MIN_K = 512  # the shortest k (or k range) the identical GEMM takes exactly
comptime EXACT_MIN_SIDE = 512  # the fewest rows, and columns, of a product it takes exactly


def exact_applies(M: Int, N: Int, K: Int, range_length: Int = 0) -> Bool:
    """The identical GEMM's canonical shape rule (docs/numerics.md): an M × N product over K, or over k ranges of
    range_length (L = min(range_length, K), each range a product of its own), is the exact product (exact/) when
    512 ≤ L ≤ MAX_K and M, N ≥ 512, and the fma chain (fma.mojo) otherwise, on every device alike. Below
    it the exact form's fixed costs lead: per output a reconstruction of about 150 integer operations (as many as
    768·11 int8 products), per operand value the residues of 11 moduli, and few tiles to spread them (on the
    H200 the byte LM's large shape, 8192 × 256 over 512, ran its products exact at half the fma chain's speed)."""
    var L = min(range_length, K) if range_length > 0 else K
    return EXACT_MIN_K <= L <= MAX_K and M >= EXACT_MIN_SIDE and N >= EXACT_MIN_SIDE


# ---- one product -------------------------------------------------------------------------------------------

@fieldwise_init
struct ProductCall(ImplicitlyCopyable, Movable):
    """One GEMM call's operands: C[M×N] (+)= op(A)·op(B), with the workspace the product asks for (0: none), for
    fast mode A's and B's bf16 copies (0: none), the k-range length of an Aᵀ·B product summed by rows (0: none;
    fma.mojo) and the fused exact kernel's split of k (0: its own choice)."""

    var c: F32Ptr
    var a: F32Ptr
    var b: F32Ptr
    var M: Int
    var N: Int
    var K: Int
    var accumulate: Bool
    var a16: Int
    var b16: Int
    var workspace: Int
    var range_length: Int
    var splits: Int

    def args(self) -> Args:
        """The call in its slots: addresses c a b a16 b16 workspace, sizes M N K accumulate range_length splits."""
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.c))
        args.addresses[1] = Int64(Int(self.a))
        args.addresses[2] = Int64(Int(self.b))
        args.addresses[3] = Int64(self.a16)
        args.addresses[4] = Int64(self.b16)
        args.addresses[5] = Int64(self.workspace)
        args.sizes[0] = Int64(self.M)
        args.sizes[1] = Int64(self.N)
        args.sizes[2] = Int64(self.K)
        args.sizes[3] = Int64(Int(self.accumulate))
        args.sizes[4] = Int64(self.range_length)
        args.sizes[5] = Int64(self.splits)
        return args

    @staticmethod
    def of(args: Args) -> ProductCall:
        """The call from its slots (`args`'s)."""
        return ProductCall(args.f32(0), args.f32(1), args.f32(2), args.size(0), args.size(1), args.size(2),
                           args.flag(3), Int(args.addresses[3]), Int(args.addresses[4]), Int(args.addresses[5]),
                           args.size(4), args.size(5))


comptime ProductBody = def[transpose_a: Bool, transpose_b: Bool](DevicePtr, ProductCall) raises thin -> None
"""A GEMM form run for one layout: the identical, the fast or the exact product."""


def launch_product[body: ProductBody, transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, n: Int, args: Args) raises:
    """One product (n is 1) as a launcher."""
    body[transpose_a, transpose_b](dev, ProductCall.of(args))


def identical_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The identical GEMM: the exact product (exact/, its fused form on a Hopper GPU) where the canonical shape rule
    takes it (exact_applies), else the fma chain (fma.mojo); with k ranges either way summed by the row tree. The
    workspace holds identical_workspace_bytes."""
    if exact_applies(p.M, p.N, p.K, p.range_length):
        # the fused kernel at its own split of k, never cuBLAS's plane products (fused_pays' other choice), whose
        # calls a recorded device graph (the language model's step plans) cannot hold
        gemm_exact_residues_on[transpose_a, transpose_b, fused=True](
            dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, p.workspace, fused_splits(p.M, p.N, p.K, 0),
            p.range_length,
        )
    else:
        fma_product[transpose_a, transpose_b](dev, p)


def fma_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The fma chain (fma.mojo) whatever the shape; the workspace holds its k ranges' partial sums."""
    gemm_on[transpose_a, transpose_b](dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, f32_at(p.workspace),
                                      p.range_length)


def fast_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """Fast mode's GEMM (fast.mojo); the workspace holds the bf16 copies not given."""
    gemm_fast_on[transpose_a, transpose_b](dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, p.a16, p.b16,
                                                p.workspace)


def exact_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The exact GEMM's SIMT form (exact/definition.mojo); the workspace holds the limbs and exponents."""
    gemm_exact_on[transpose_a, transpose_b](dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, p.workspace)


def exact_residue_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The exact GEMM's residue form (exact/forms.mojo): the same value from residues modulo primes (the GPU's on
    its tensor cores, the CPU's with vpmaddwd); the workspace holds the residue planes and their products."""
    gemm_exact_residues_on[transpose_a, transpose_b](dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, p.workspace,
                                                     p.splits, p.range_length)


def exact_fused_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The exact GEMM's fused tensor-core form (exact/fused_sm90.mojo): the residue form with its plane products and
    reconstruction in the fused GPU kernel, k split into p.splits ranges (0: the kernel's choice); on the CPU the
    unfused residue form."""
    gemm_exact_residues_on[transpose_a, transpose_b, fused=True](
        dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, p.workspace, p.splits, p.range_length
    )


# ---- a group of products -----------------------------------------------------------------------------------

comptime GROUP_FMA = 0  # the fma chain's group (gemm_group_on)
comptime GROUP_EXACT_SUMMED = 1  # one exact product over the terms' joined k (gemm_exact_summed_on)
comptime GROUP_EXACT_SHARED_A = 2  # exact products of one A apart, its planes found once (gemm_exact_shared_a_on)
comptime GROUP_APART = 3  # exact products apart of several A, or exact beside fma ones: each runs alone


def group_form(M: Int, N: Int, K: Int, sizes: Terms, terms: Int, summed: Bool, one_a: Bool, range_length: Int) -> Int:
    """The form a group of identical products runs (GROUP_*): summed (sizes: each term's k), exact where the shape
    rule takes the product over the joined k; apart (sizes: each term's n, one k), exact where the rule takes every
    product and they share one A (`one_a`), apart where it takes some, else the fma chain's group. The bits are
    each product's alone whichever form runs."""
    if summed:
        var joined = 0
        for t in range(terms):
            joined += sizes[t]
        return GROUP_EXACT_SUMMED if exact_applies(M, N, joined, range_length) else GROUP_FMA
    var exact = 0
    for t in range(terms):
        if exact_applies(M, sizes[t], K, range_length):
            exact += 1
    if exact == 0:
        return GROUP_FMA
    return GROUP_EXACT_SHARED_A if exact == terms and one_a else GROUP_APART


struct GroupSlots(Movable):
    """The operands of a group of products in their slots: each term's C, A and B, its varying size (N_t apart,
    K_t summed), and the flags (terms, summed, accumulate, exact)."""

    comptime T = GROUP_TERMS
    var c: Array[F32Ptr, Self.T]
    var a: Array[F32Ptr, Self.T]
    var b: Array[F32Ptr, Self.T]
    var sizes: Array[Int, Self.T]
    var terms: Int
    var summed: Bool
    var accumulate: Bool
    var exact: Bool

    def __init__(out self, args: Args):
        self.c = Array[F32Ptr, Self.T](fill=args.f32(0))
        self.a = Array[F32Ptr, Self.T](fill=args.f32(Self.T))
        self.b = Array[F32Ptr, Self.T](fill=args.f32(2 * Self.T))
        self.sizes = Array[Int, Self.T](fill=0)
        comptime for t in range(Self.T):
            self.c[t] = args.f32(t)
            self.a[t] = args.f32(Self.T + t)
            self.b[t] = args.f32(2 * Self.T + t)
            self.sizes[t] = args.size(3 + t)
        var flags = args.size(6)
        self.terms = flags & 3
        self.summed = (flags >> 2) & 1 != 0
        self.accumulate = (flags >> 3) & 1 != 0
        self.exact = (flags >> 4) & 1 != 0


def group_args(c: Terms, a: Terms, b: Terms, M: Int, N: Int, K: Int, sizes: Terms, terms: Int, summed: Bool,
               accumulate: Bool, workspace: Int, range_length: Int) raises -> Args:
    """A group's slots for launch_product_group (GroupSlots reads them back), its form decided by group_form; a
    group the launcher cannot run as one (GROUP_APART, a summed exact group over k ranges) is refused."""
    if terms < 1 or terms > GROUP_TERMS:
        raise Error("gemm_group: 1 to ", GROUP_TERMS, " products, got ", terms)
    var one_a = True
    for t in range(terms):
        one_a = one_a and a[t] == a[0]
    var form = group_form(M, N, K, sizes, terms, summed, one_a, range_length)
    if form == GROUP_EXACT_SUMMED and range_length > 0:
        raise Error("gemm_group: summed exact products take no k ranges")
    if form == GROUP_APART:
        raise Error("gemm_group: exact products group only when all are exact and of one A (gemm runs each)")
    var args = Args.empty()
    for t in range(terms):
        args.addresses[t] = Int64(c[t])
        args.addresses[GROUP_TERMS + t] = Int64(a[t])
        args.addresses[2 * GROUP_TERMS + t] = Int64(b[t])
        args.sizes[3 + t] = Int64(sizes[t])
    args.addresses[3 * GROUP_TERMS] = Int64(workspace)
    args.sizes[0] = Int64(M)
    args.sizes[1] = Int64(N)
    args.sizes[2] = Int64(K)
    var exact = form == GROUP_EXACT_SUMMED or form == GROUP_EXACT_SHARED_A
    args.sizes[6] = Int64(terms | (Int(summed) << 2) | (Int(accumulate) << 3) | (Int(exact) << 4))
    args.sizes[7] = Int64(range_length)
    return args


def launch_product_group[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, n: Int, args: Args) raises:
    """A group of products (n is 1) as a launcher, from group_args's slots: exact and summed, one product over the
    terms' joined k; exact and apart, products of one A; else the fma chain's group."""
    var group = GroupSlots(args)
    if group.exact and group.summed:
        gemm_exact_summed_on[transpose_a, transpose_b, GroupSlots.T](
            dev, group.c[0], group.a, group.b, args.size(0), args.size(1), group.sizes, group.terms, group.accumulate,
            Int(args.addresses[3 * GroupSlots.T]),
        )
    elif group.exact:
        gemm_exact_shared_a_on[transpose_a, transpose_b, GroupSlots.T](
            dev, group.c, group.a[0], group.b, args.size(0), group.sizes, group.terms, args.size(2), group.accumulate,
            Int(args.addresses[3 * GroupSlots.T]), args.size(7),
        )
    else:
        gemm_group_on[transpose_a, transpose_b](
            dev, group.terms, group.summed, group.c, group.a, group.b, args.size(0), args.size(1), args.size(2),
            group.sizes, group.accumulate, args.f32(3 * GroupSlots.T), args.size(7),
        )


# ---- workspace ---------------------------------------------------------------------------------------------

def exact_workspace_bytes(M: Int, N: Int, K: Int, splits: Int, range_length: Int, gpu: Bool, fused: Bool) -> Int:
    """Bytes of the workspace an exact M×N×K product needs on a GPU or on the CPU, in any form (the fused one's k in
    `splits` ranges, 0 its own choice; k cut into ranges of range_length, 0 none; `fused`: the fused form)."""
    if 0 < range_length < K:
        return ranged_workspace_bytes(M, N, K, range_length, gpu, fused)
    return max(workspace_bytes(M, N, K), residue_workspace_bytes(M, N, K, splits, gpu))


def identical_workspace_bytes(M: Int, N: Int, K: Int, transpose_a: Bool, range_length: Int, gpu: Bool,
                              fma_only: Bool) -> Int:
    """Bytes of the workspace the identical GEMM needs for an M×N×K product: the exact form's where the rule takes
    it (exact_applies) unless `fma_only` (the engine's gemm_fma), else the fma chain's partial sums of its k ranges
    (none for one range)."""
    if not fma_only and exact_applies(M, N, K, range_length):
        return exact_workspace_bytes(M, N, K, 0, range_length, gpu, True)
    var chunks = k_chunks(M, N, K, transpose_a, range_length)
    return 4 * chunks * M * N if chunks > 1 else 0


def shared_a_workspace_bytes(M: Int, N: Terms, terms: Int, K: Int, range_length: Int, gpu: Bool) -> Int:
    """Bytes of the workspace of exact products of one A apart (gemm_exact_shared_a_on) over the terms' n: the
    product of their columns joined where it runs them so (columns_joined), else the largest product's."""
    var columns = 0
    var largest = 0
    for t in range(terms):
        columns += N[t]
        largest = max(largest, exact_workspace_bytes(M, N[t], K, 0, range_length, gpu, True))
    if columns_joined(K, range_length, terms, gpu):
        return exact_workspace_bytes(M, columns, K, 0, range_length, gpu, True)
    return largest

