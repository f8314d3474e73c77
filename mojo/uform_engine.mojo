"""The extension module `uform._engine`: every Python entry point of the engine, in one place.

Python passes buffers as integer addresses on a device (see python/uform/engine.py, which wraps
numpy arrays and device allocations), sizes as integers and scalars as floats. Each kernel is
registered here by one line that names its body and its `Interface` (the names of its operands);
the module exports every interface as KERNEL_INTERFACES and the engine's other facts (op codes,
chunk sizes, compiled head dimensions and attention tile, form codes) as FACTS, which python/uform/kernels.py reads
once. Kernel files under kernels/ hold only math and their launchers.
"""

from std.collections import Array
from std.os import abort
from std.python import Python, PythonObject
from std.python.bindings import PythonModuleBuilder
from engine.device import Device, F32Ptr, f32_at, gpu_device_count
from engine.launch import (
    Args, DevicePtr, ElementBody, GpuTeamBody, Interface, LanesBody, Launcher, RowBody, TeamBody, args_from_python,
    device_of, launch_elements, launch_gpu_teams, launch_index, launch_lanes, launch_rows, launch_teams,
)
from engine.plan import plan_begin, plan_end, plan_free, plan_run, record_or_launch
from engine.target import HAS_ACCELERATOR, HAS_NVIDIA
from kernels import (adamw, attention, attention_fast, attention_rows, choices, contrastive, cross_entropy, embedding,
                     gemm, gemm_exact, fast_producers, gemm_fast, late_interaction, norms, pointwise, rotary, rows,
                     tree_sum, verdict)


# ---- the Device type -------------------------------------------------------------------

def device_open(py_self: PythonObject, ordinal: PythonObject) raises -> PythonObject:
    device_of(py_self)[].open(Int(py=ordinal))
    return PythonObject(None)


def device_ordinal(py_self: PythonObject) raises -> PythonObject:
    return PythonObject(device_of(py_self)[].ordinal)


def device_alloc(py_self: PythonObject, size: PythonObject) raises -> PythonObject:
    return PythonObject(device_of(py_self)[].alloc(Int(py=size)))


def device_free(py_self: PythonObject, address: PythonObject) raises -> PythonObject:
    device_of(py_self)[].free(Int(py=address))
    return PythonObject(None)


def device_upload(
    py_self: PythonObject, address: PythonObject, offset: PythonObject, host: PythonObject, size: PythonObject
) raises -> PythonObject:
    """Host bytes into the allocation at `address`, from its byte `offset` (a view's)."""
    device_of(py_self)[].upload(Int(py=address), Int(py=offset), Int(py=host), Int(py=size))
    return PythonObject(None)


def device_download(
    py_self: PythonObject, host: PythonObject, address: PythonObject, offset: PythonObject, size: PythonObject
) raises -> PythonObject:
    device_of(py_self)[].download(Int(py=host), Int(py=address), Int(py=offset), Int(py=size))
    return PythonObject(None)


def device_copy(py_self: PythonObject, destination: PythonObject, source: PythonObject, size: PythonObject) raises -> PythonObject:
    device_of(py_self)[].copy(Int(py=destination), Int(py=source), Int(py=size))
    return PythonObject(None)


def device_synchronize(py_self: PythonObject) raises -> PythonObject:
    device_of(py_self)[].synchronize()
    return PythonObject(None)


def device_plan_begin(py_self: PythonObject) raises -> PythonObject:
    """Record the kernel launches that follow instead of running them (engine.plan)."""
    plan_begin(device_of(py_self))
    return PythonObject(None)


def device_plan_end(py_self: PythonObject, graph: PythonObject) raises -> PythonObject:
    """Keep the recording as a plan (graph: replayed as a device graph on a GPU); answers its id."""
    return PythonObject(plan_end(device_of(py_self), Bool(py=graph)))


def device_plan_run(py_self: PythonObject, id: PythonObject) raises -> PythonObject:
    plan_run(device_of(py_self), Int(py=id))
    return PythonObject(None)


def device_plan_free(py_self: PythonObject, id: PythonObject) raises -> PythonObject:
    plan_free(device_of(py_self), Int(py=id))
    return PythonObject(None)


# ---- module facts ----------------------------------------------------------------------

def gpu_count() raises -> PythonObject:
    return PythonObject(gpu_device_count())


def has_accelerator() raises -> PythonObject:
    return PythonObject(HAS_ACCELERATOR)


def engine_facts() raises -> PythonObject:
    """The constants Python needs, defined once in the kernels."""
    var facts = Python.dict()
    var ops = Python.list()
    comptime for i in range(len(pointwise.UNARY_OPS)):
        ops.append(PythonObject(pointwise.UNARY_OPS[i]))
    facts["unary_ops"] = ops
    var head_dims = Python.list()
    comptime for i in range(len(attention.HEAD_DIMS)):
        head_dims.append(PythonObject(attention.HEAD_DIMS[i]))
    facts["attention_head_dims"] = head_dims
    facts["attention_tile"] = PythonObject(attention.TILE)
    facts["attention_rows_max_teams"] = PythonObject(attention_rows.ROWS_MAX_TEAMS)
    var fast_head_dims = Python.list()
    comptime for i in range(len(attention_fast.HEAD_DIMS)):
        fast_head_dims.append(PythonObject(attention_fast.HEAD_DIMS[i]))
    facts["attention_fast_head_dims"] = fast_head_dims
    facts["attention_fast_tile"] = PythonObject(attention_fast.TILE)
    facts["column_chunk"] = PythonObject(norms.COLUMN_CHUNK)
    facts["embedding_chunk"] = PythonObject(embedding.CHUNK)
    facts["rotary_pairs_per_task"] = PythonObject(rotary.PAIRS_PER_TASK)
    facts["cast_lanes"] = PythonObject(gemm_fast.CAST_LANES)
    facts["exact_gemm_max_k"] = PythonObject(gemm_exact.MAX_K)
    facts["exact_residue_alignment"] = PythonObject(gemm_exact.RESIDUE_ALIGNMENT)
    facts["form_weighted_sigmoid"] = PythonObject(contrastive.FORM_WEIGHTED_SIGMOID)
    facts["form_ranked"] = PythonObject(contrastive.FORM_RANKED)
    facts["norm_epsilon"] = PythonObject(Float64(contrastive.NORM_EPSILON))
    facts["largest_squarable"] = PythonObject(verdict.LARGEST_SQUARABLE)
    return facts


def interface_of(interface: Interface) raises -> PythonObject:
    """An interface as Python sees it: [buffer names, size names, scalar names], each a str."""
    var entry = Python.list()
    entry.append(PythonObject(interface.buffers))
    entry.append(PythonObject(interface.sizes))
    entry.append(PythonObject(interface.scalars))
    return entry


# ---- kernel entry points: (device, n, addresses, sizes, scalars) --------------------------

def kernel_entry[launch: Launcher](
    device: PythonObject, n: PythonObject, addresses: PythonObject, sizes: PythonObject, scalars: PythonObject
) raises -> PythonObject:
    """A kernel's Python entry point: its operands from Python, then its launch over [0, n) (recorded instead while
    the device records a plan)."""
    record_or_launch[launch](device_of(device), Int(py=n), args_from_python(addresses, sizes, scalars))
    return PythonObject(None)


def launch_attention[body: TeamBody, registers: Int](dev: DevicePtr, n: Int, args: Args) raises:
    """A team kernel of attention, the variant compiled for the operands' head dimension."""
    var head_dim = attention.Attention(args).head_dim
    comptime for i in range(len(attention.HEAD_DIMS)):
        comptime D = attention.HEAD_DIMS[i]
        if head_dim == D:
            launch_teams[D, attention.TEAM, attention.SCRATCH, body, attention.teams_per_sm[D](registers)](
                dev, n, args
            )
            return
    raise Error("attention: head_dim ", head_dim, " is not compiled")


def launch_fast_attention[body: GpuTeamBody, registers: Int](dev: DevicePtr, n: Int, args: Args) raises:
    """A fast-mode attention kernel (GPU only: it raises on the CPU), the variant for the operands' head dimension,
    compiled to keep a thread within `registers` (attention_fast.blocks_per_sm)."""
    var head_dim = attention.Attention(args).head_dim
    comptime if HAS_ACCELERATOR and not HAS_NVIDIA:  # its mma.sync shapes (m16n8k16) are NVIDIA's
        raise Error("fast attention: this build has no fast kernels")
    else:
        comptime for i in range(len(attention_fast.HEAD_DIMS)):
            comptime D = attention_fast.HEAD_DIMS[i]
            if head_dim == D:
                launch_gpu_teams[D, attention_fast.TEAM, attention_fast.blocks_per_sm[D](registers), body](dev, n,
                                                                                                           args)
                return
        raise Error("fast attention: head_dim ", head_dim, " has no fast kernel")


@fieldwise_init
struct ProductCall(ImplicitlyCopyable, Movable):
    """One GEMM call's operands: C[M×N] (+)= op(A)·op(B), with the workspace the product asks for (0: none), for
    fast mode A's and B's bf16 copies (0: none), the k-range length of an Aᵀ·B product summed by rows (0: none;
    kernels/gemm.mojo) and the fused exact kernel's split of k (0: its own choice). It travels to its launcher in
    Args slots (`of`), as every kernel's operands do."""

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

    @staticmethod
    def of(args: Args) -> ProductCall:
        """The call from its slots: addresses c a b a16 b16 workspace, sizes M N K accumulate range_length splits."""
        return ProductCall(args.f32(0), args.f32(1), args.f32(2), args.size(0), args.size(1), args.size(2),
                           args.flag(3), Int(args.addresses[3]), Int(args.addresses[4]), Int(args.addresses[5]),
                           args.size(4), args.size(5))


comptime ProductBody = def[transpose_a: Bool, transpose_b: Bool](DevicePtr, ProductCall) raises thin -> None
"""A GEMM form run for one layout: the identical, the fast or the exact product."""


def product[body: ProductBody](
    device: PythonObject, c: PythonObject, a: PythonObject, b: PythonObject,
    M: PythonObject, N: PythonObject, K: PythonObject,
    transpose_a: PythonObject, transpose_b: PythonObject, accumulate: PythonObject, a16: PythonObject,
    b16: PythonObject, workspace: PythonObject, range_length: PythonObject, splits: PythonObject,
) raises -> PythonObject:
    """C[M×N] (+)= op(A)·op(B) by `body`, compiled for each of the layouts A·B, Aᵀ·B and A·Bᵀ."""
    var ta = Bool(py=transpose_a)
    var tb = Bool(py=transpose_b)
    if ta and tb:
        raise Error("gemm: transposing both A and B is not supported")
    var args = Args.empty()
    var addresses = (c, a, b, a16, b16, workspace)
    comptime for i in range(6):
        args.addresses[i] = Int64(Int(py=addresses[i]))
    args.sizes[0] = Int64(Int(py=M))
    args.sizes[1] = Int64(Int(py=N))
    args.sizes[2] = Int64(Int(py=K))
    args.sizes[3] = Int64(Int(Bool(py=accumulate)))
    args.sizes[4] = Int64(Int(py=range_length))
    args.sizes[5] = Int64(Int(py=splits))
    var dev = device_of(device)
    if ta:
        record_or_launch[launch_product[body, True, False]](dev, 1, args)
    elif tb:
        record_or_launch[launch_product[body, False, True]](dev, 1, args)
    else:
        record_or_launch[launch_product[body, False, False]](dev, 1, args)
    return PythonObject(None)


def product_group(
    device: PythonObject, summed: PythonObject, c: PythonObject, a: PythonObject, b: PythonObject, M: PythonObject,
    N: PythonObject, K: PythonObject, x: PythonObject, transpose_a: PythonObject, transpose_b: PythonObject,
    accumulate: PythonObject, workspace: PythonObject, range_length: PythonObject,
) raises -> PythonObject:
    """A group of identical products (kernels/gemm.mojo, gemm_group_on): c, a, b and x are lists of one to three
    terms' addresses and varying sizes (N_t apart, K_t summed). Products apart that the exact GEMM's shape rule
    takes group only when all of them are exact and of one A, whose planes are then found once
    (gemm_exact_shared_a_on); summed terms are one product over their joined k, exact where the rule takes the
    joined product (gemm_exact_summed_on)."""
    var ta = Bool(py=transpose_a)
    var tb = Bool(py=transpose_b)
    if ta and tb:
        raise Error("gemm: transposing both A and B is not supported")
    var terms = Int(py=len(c))
    if terms < 1 or terms > gemm.GROUP_TERMS:
        raise Error("gemm_group: 1 to ", gemm.GROUP_TERMS, " products, got ", terms)
    var args = Args.empty()
    var exact = 0
    var joined = 0
    for t in range(terms):
        joined += Int(py=x[t])
    if Bool(py=summed) and gemm_exact.exact_applies(Int(py=M), Int(py=N), joined, Int(py=range_length)):
        if Int(py=range_length) > 0:
            raise Error("gemm_group: summed exact products take no k ranges")
        exact = terms
    for t in range(terms):
        var n = Int(py=x[t]) if not Bool(py=summed) else Int(py=N)
        if not Bool(py=summed) and gemm_exact.exact_applies(Int(py=M), n, Int(py=K), Int(py=range_length)):
            exact += 1
            if Int(py=a[t]) != Int(py=a[0]):
                raise Error("gemm_group: a ", Int(py=M), "×", n, "×", Int(py=K), " product is the exact GEMM's, which",
                            " groups apart only of one A (gemm runs it)")
        args.addresses[t] = Int64(Int(py=c[t]))
        args.addresses[gemm.GROUP_TERMS + t] = Int64(Int(py=a[t]))
        args.addresses[2 * gemm.GROUP_TERMS + t] = Int64(Int(py=b[t]))
        args.sizes[3 + t] = Int64(Int(py=x[t]))
    args.addresses[3 * gemm.GROUP_TERMS] = Int64(Int(py=workspace))
    args.sizes[0] = Int64(Int(py=M))
    args.sizes[1] = Int64(Int(py=N))
    args.sizes[2] = Int64(Int(py=K))
    if 0 < exact < terms:
        raise Error("gemm_group: exact products group only with exact ones (gemm runs each)")
    var flags = terms | (Int(Bool(py=summed)) << 2) | (Int(Bool(py=accumulate)) << 3) | (Int(exact > 0) << 4)
    args.sizes[6] = Int64(flags)
    args.sizes[7] = Int64(Int(py=range_length))
    var dev = device_of(device)
    if ta:
        record_or_launch[launch_product_group[True, False]](dev, 1, args)
    elif tb:
        record_or_launch[launch_product_group[False, True]](dev, 1, args)
    else:
        record_or_launch[launch_product_group[False, False]](dev, 1, args)
    return PythonObject(None)


struct GroupSlots(Movable):
    """The operands of a group of products, from the slots product_group fills: each term's C, A and B, its varying
    size (N_t apart, K_t summed), and the flags (terms, summed, accumulate, exact)."""

    comptime T = gemm.GROUP_TERMS
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


def launch_product_group[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, n: Int, args: Args) raises:
    """A group of products (n is 1) as a launcher, from the slots product_group fills: exact and summed, one product
    over the terms' joined k; exact and apart, products of one A; else the fma chain's group."""
    var group = GroupSlots(args)
    if group.exact and group.summed:
        gemm_exact.gemm_exact_summed_on[transpose_a, transpose_b, GroupSlots.T](
            dev, group.c[0], group.a, group.b, args.size(0), args.size(1), group.sizes, group.terms, group.accumulate,
            Int(args.addresses[3 * GroupSlots.T]),
        )
    elif group.exact:
        gemm_exact.gemm_exact_shared_a_on[transpose_a, transpose_b, GroupSlots.T](
            dev, group.c, group.a[0], group.b, args.size(0), group.sizes, group.terms, args.size(2), group.accumulate,
            Int(args.addresses[3 * GroupSlots.T]), args.size(7),
        )
    else:
        gemm.gemm_group_on[transpose_a, transpose_b](
            dev, group.terms, group.summed, group.c, group.a, group.b, args.size(0), args.size(1), args.size(2),
            group.sizes, group.accumulate, args.f32(3 * GroupSlots.T), args.size(7),
        )


def launch_product[body: ProductBody, transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, n: Int, args: Args) raises:
    """One product (n is 1) as a launcher."""
    body[transpose_a, transpose_b](dev, ProductCall.of(args))


def identical_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The identical GEMM: the exact product (kernels/gemm_exact.mojo, its fused form on a Hopper GPU) where the
    canonical shape rule takes it (gemm_exact.exact_applies), else the fma chain (kernels/gemm.mojo); with k ranges
    either way summed by the row tree. The workspace holds gemm_workspace's bytes."""
    if gemm_exact.exact_applies(p.M, p.N, p.K, p.range_length):
        # the fused kernel at its own split of k, never cuBLAS's plane products (fused_pays' other choice), whose
        # calls a recorded device graph (the language model's step plans) cannot hold
        gemm_exact.gemm_exact_residues_on[transpose_a, transpose_b, fused=True](
            dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, p.workspace, gemm_exact.fused_splits(p.M, p.N, p.K, 0),
            p.range_length,
        )
    else:
        fma_product[transpose_a, transpose_b](dev, p)


def fma_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The fma chain (kernels/gemm.mojo) whatever the shape; the workspace holds its k ranges' partial sums."""
    gemm.gemm_on[transpose_a, transpose_b](dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, f32_at(p.workspace),
                                           p.range_length)


def fast_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """Fast mode's GEMM (kernels/gemm_fast.mojo); the workspace holds the bf16 copies not given."""
    gemm_fast.gemm_fast_on[transpose_a, transpose_b](dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, p.a16,
                                                     p.b16, p.workspace)


def exact_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The exact GEMM (kernels/gemm_exact.mojo); the workspace holds the limbs and exponents."""
    gemm_exact.gemm_exact_on[transpose_a, transpose_b](dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate,
                                                       p.workspace)


def exact_residue_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The exact GEMM's residue form (kernels/gemm_exact.mojo): the same value from residues modulo primes (the
    GPU's on its tensor cores, the CPU's with vpmaddwd); the workspace holds the residue planes and their products."""
    gemm_exact.gemm_exact_residues_on[transpose_a, transpose_b](dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate,
                                                                p.workspace, p.splits, p.range_length)


def exact_fused_product[transpose_a: Bool, transpose_b: Bool](dev: DevicePtr, p: ProductCall) raises:
    """The exact GEMM's fused tensor-core form (kernels/gemm_exact.mojo, exact_fused_tile): the residue form with
    its plane products and reconstruction in the fused GPU kernel, k split into p.splits ranges (0: the kernel's
    choice); on the CPU the unfused residue form."""
    gemm_exact.gemm_exact_residues_on[transpose_a, transpose_b, fused=True](
        dev, p.c, p.a, p.b, p.M, p.N, p.K, p.accumulate, p.workspace, p.splits, p.range_length
    )


def gemm_fast_workspace(M: PythonObject, N: PythonObject, K: PythonObject) raises -> PythonObject:
    """Bytes of the workspace a fast M×N×K product needs for its operands' bf16 copies."""
    return PythonObject(gemm_fast.workspace_bytes(Int(py=M), Int(py=N), Int(py=K)))


def exact_workspace_bytes(M: Int, N: Int, K: Int, splits: Int, range_length: Int, gpu: Bool, fused: Bool) -> Int:
    """Bytes of the workspace an exact M×N×K product needs on a GPU or on the CPU, in any form (the fused one's k in
    `splits` ranges, 0 its own choice; k cut into ranges of range_length, 0 none; `fused`: the fused form)."""
    if 0 < range_length < K:
        return gemm_exact.ranged_workspace_bytes(M, N, K, range_length, gpu, fused)
    return max(gemm_exact.workspace_bytes(M, N, K), gemm_exact.residue_workspace_bytes(M, N, K, splits, gpu))


def gemm_exact_workspace(
    M: PythonObject, N: PythonObject, K: PythonObject, splits: PythonObject, range_length: PythonObject,
    gpu: PythonObject, fused: PythonObject,
) raises -> PythonObject:
    """exact_workspace_bytes for Python."""
    return PythonObject(exact_workspace_bytes(Int(py=M), Int(py=N), Int(py=K), Int(py=splits), Int(py=range_length),
                                              Bool(py=gpu), Bool(py=fused)))


def gemm_shared_a_workspace(M: PythonObject, N: PythonObject, K: PythonObject, range_length: PythonObject,
                            gpu: PythonObject) raises -> PythonObject:
    """Bytes of the workspace of exact products of one A apart (gemm_exact_shared_a_on) over the terms' n in the list
    N: the product of their columns joined where it runs them so (gemm_exact.columns_joined), else the largest
    product's."""
    var m = Int(py=M)
    var k = Int(py=K)
    var k_range = Int(py=range_length)
    var on_gpu = Bool(py=gpu)
    var terms = Int(py=len(N))
    var columns = 0
    var largest = 0
    for t in range(terms):
        var n = Int(py=N[t])
        columns += n
        largest = max(largest, exact_workspace_bytes(m, n, k, 0, k_range, on_gpu, True))
    if gemm_exact.columns_joined(k, k_range, terms, on_gpu):
        return PythonObject(exact_workspace_bytes(m, columns, k, 0, k_range, on_gpu, True))
    return PythonObject(largest)


def gemm_summed_workspace(M: PythonObject, N: PythonObject, K: PythonObject, gpu: PythonObject) raises -> PythonObject:
    """Bytes of the workspace of summed exact products (gemm_exact_summed_on) over the terms' k in the list K."""
    var terms = Int(py=len(K))
    if terms < 1 or terms > gemm.GROUP_TERMS:
        raise Error("gemm_summed_workspace: 1 to ", gemm.GROUP_TERMS, " terms, got ", terms)
    var k = Array[Int, gemm.GROUP_TERMS](fill=0)
    for t in range(terms):
        k[t] = Int(py=K[t])
    return PythonObject(gemm_exact.summed_workspace_bytes(Int(py=M), Int(py=N), k, terms, Bool(py=gpu)))


def gemm_is_exact(M: PythonObject, N: PythonObject, K: PythonObject, range_length: PythonObject) raises -> PythonObject:
    """Whether the identical GEMM runs an M×N×K product (k cut into ranges of range_length, 0 none) exactly
    (gemm_exact.exact_applies)."""
    return PythonObject(gemm_exact.exact_applies(Int(py=M), Int(py=N), Int(py=K), Int(py=range_length)))


def gemm_workspace(M: PythonObject, N: PythonObject, K: PythonObject, transpose_a: PythonObject,
                   range_length: PythonObject, gpu: PythonObject, fma_only: PythonObject) raises -> PythonObject:
    """Bytes of the workspace the identical GEMM needs for an M×N×K product: the exact form's where the rule takes
    it (gemm_is_exact) unless `fma_only` (the engine's gemm_fma), else the fma chain's partial sums of its k ranges
    (none for one range)."""
    var m = Int(py=M)
    var n = Int(py=N)
    var k = Int(py=K)
    var k_range = Int(py=range_length)
    if not Bool(py=fma_only) and gemm_exact.exact_applies(m, n, k, k_range):
        return PythonObject(exact_workspace_bytes(m, n, k, 0, k_range, Bool(py=gpu), True))
    var chunks = gemm.k_chunks(m, n, k, Bool(py=transpose_a), k_range)
    return PythonObject(4 * chunks * m * n if chunks > 1 else 0)


def register[launch: Launcher](
    mut m: PythonModuleBuilder, interfaces: PythonObject, name: StaticString, interface: Interface
) raises:
    """Register a kernel's entry point under `name`, ending in `launch`, with its interface."""
    m.def_function[kernel_entry[launch]](name)
    interfaces[name] = interface_of(interface)


def index[body: def(Int, Args) thin -> None](
    mut m: PythonModuleBuilder, interfaces: PythonObject, name: StaticString, interface: Interface
) raises:
    """An index kernel: body(i, args) for every i, one GPU thread or one CPU call each."""
    register[launch_index[body]](m, interfaces, name, interface)


def lanes[count: Int, body: LanesBody](
    mut m: PythonModuleBuilder, interfaces: PythonObject, name: StaticString, interface: Interface
) raises:
    """An index kernel of `count` lanes a task: one by one on a GPU thread, as one vector on the CPU."""
    register[launch_lanes[count, body]](m, interfaces, name, interface)


def rows_of[body: RowBody](
    mut m: PythonModuleBuilder, interfaces: PythonObject, name: StaticString, interface: Interface
) raises:
    """A row kernel: one GPU warp or one CPU call a row."""
    register[launch_rows[body]](m, interfaces, name, interface)


def elements[body: ElementBody](
    mut m: PythonModuleBuilder, interfaces: PythonObject, name: StaticString, interface: Interface
) raises:
    """An element-wise kernel: several elements a CPU call (see launch_elements)."""
    register[launch_elements[body]](m, interfaces, name, interface)


def teams[body: TeamBody, registers: Int](
    mut m: PythonModuleBuilder, interfaces: PythonObject, name: StaticString
) raises:
    """An attention team kernel (every one reads the ATTENTION interface)."""
    register[launch_attention[body, registers]](m, interfaces, name, attention.ATTENTION)


def fast_teams[body: GpuTeamBody, registers: Int](
    mut m: PythonModuleBuilder, interfaces: PythonObject, name: StaticString
) raises:
    """A fast-mode attention kernel (the ATTENTION interface; GPU only)."""
    register[launch_fast_attention[body, registers]](m, interfaces, name, attention.ATTENTION)


@export
def PyInit__engine() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("_engine")
        _ = (
            m.add_type[Device]("Device")
            .def_init_defaultable[Device]()
            .def_method[device_open]("open")
            .def_method[device_ordinal]("ordinal")
            .def_method[device_alloc]("alloc")
            .def_method[device_free]("free")
            .def_method[device_upload]("upload")
            .def_method[device_download]("download")
            .def_method[device_copy]("copy")
            .def_method[device_synchronize]("synchronize")
            .def_method[device_plan_begin]("plan_begin")
            .def_method[device_plan_end]("plan_end")
            .def_method[device_plan_run]("plan_run")
            .def_method[device_plan_free]("plan_free")
        )
        m.def_function[gpu_count]("gpu_count")
        m.def_function[has_accelerator]("has_accelerator")
        m.def_function[product[identical_product]]("gemm")
        m.def_function[product[fma_product]]("gemm_fma")
        m.def_function[gemm_workspace]("gemm_workspace")
        m.def_function[product_group]("gemm_group")
        m.def_function[gemm_summed_workspace]("gemm_summed_workspace")
        m.def_function[gemm_shared_a_workspace]("gemm_shared_a_workspace")
        m.def_function[product[exact_product]]("gemm_exact")
        m.def_function[product[exact_residue_product]]("gemm_exact_residues")
        m.def_function[product[exact_fused_product]]("gemm_exact_fused")
        m.def_function[gemm_exact_workspace]("gemm_exact_workspace")
        m.def_function[gemm_is_exact]("gemm_is_exact")
        m.def_function[product[fast_product]]("gemm_fast")
        m.def_function[gemm_fast_workspace]("gemm_fast_workspace")
        var k = Python.dict()
        index[gemm_fast.cast_bf16](m, k, "cast_bf16", gemm_fast.CAST_BF16)
        index[fast_producers.silu_bf16](m, k, "silu_bf16", fast_producers.SILU_BF16)
        index[fast_producers.silu_backward_bf16](m, k, "silu_backward_bf16", fast_producers.SILU_BACKWARD_BF16)
        rows_of[fast_producers.rmsnorm_bf16](m, k, "rmsnorm_bf16", fast_producers.RMSNORM_BF16)
        rows_of[fast_producers.rmsnorm_backward_bf16](m, k, "rmsnorm_backward_bf16",
                                                       fast_producers.RMSNORM_BACKWARD_BF16)
        elements[pointwise.unary_math](m, k, "unary_math", pointwise.UNARY_MATH)
        elements[pointwise.silu](m, k, "silu", pointwise.SILU)
        elements[pointwise.silu_backward](m, k, "silu_backward", pointwise.SILU_BACKWARD)
        elements[pointwise.add](m, k, "add", pointwise.ADD)
        elements[pointwise.scale](m, k, "scale", pointwise.SCALE)
        elements[pointwise.fill](m, k, "fill", pointwise.FILL)
        rows_of[norms.rmsnorm_forward](m, k, "rmsnorm_forward", norms.RMSNORM_FORWARD)
        rows_of[norms.rmsnorm_backward](m, k, "rmsnorm_backward", norms.RMSNORM_BACKWARD)
        index[norms.softmax_forward](m, k, "softmax_forward", norms.SOFTMAX_FORWARD)
        index[norms.softmax_backward](m, k, "softmax_backward", norms.SOFTMAX_BACKWARD)
        rows_of[cross_entropy.cross_entropy](m, k, "cross_entropy", cross_entropy.CROSS_ENTROPY)
        register[norms.launch_column_partial_sums](m, k, "column_partial_sums", norms.COLUMN_PARTIAL_SUMS)
        index[norms.column_sums_finish](m, k, "column_sums_finish", norms.COLUMN_SUMS_FINISH)
        elements[tree_sum.tree_sum](m, k, "tree_sum", tree_sum.TREE_SUM)
        teams[attention.attention_forward, attention.FORWARD_REGISTERS](m, k, "attention_forward")
        index[attention.attention_backward_delta](m, k, "attention_backward_delta", attention.ATTENTION)
        teams[attention.attention_backward_dkdv, attention.DKDV_REGISTERS](m, k, "attention_backward_dkdv")
        teams[attention.attention_backward_dq, attention.DQ_REGISTERS](m, k, "attention_backward_dq")
        rows_of[attention_rows.attention_forward_rows](m, k, "attention_forward_rows", attention.ATTENTION)
        rows_of[attention_rows.attention_backward_rows](m, k, "attention_backward_rows", attention.ATTENTION)
        register[attention_fast.launch_backward_delta](m, k, "attention_backward_delta_fast", attention.ATTENTION)
        fast_teams[attention_fast.attention_forward_fast, attention_fast.FORWARD_REGISTERS](
            m, k, "attention_forward_fast"
        )
        fast_teams[attention_fast.attention_backward_dkdv_fast, attention_fast.DKDV_REGISTERS](
            m, k, "attention_backward_dkdv_fast"
        )
        fast_teams[attention_fast.attention_backward_dq_fast, attention_fast.DQ_REGISTERS](
            m, k, "attention_backward_dq_fast"
        )
        lanes[rotary.PAIRS_PER_TASK, rotary.rotary](m, k, "rotary", rotary.ROTARY)
        index[rotary.rotary_fast](m, k, "rotary_fast", rotary.ROTARY_FAST)
        rows_of[embedding.embedding_forward](m, k, "embedding_forward", embedding.EMBEDDING_FORWARD)
        rows_of[embedding.token_groups](m, k, "token_groups", embedding.TOKEN_GROUPS)
        index[embedding.embedding_backward](m, k, "embedding_backward", embedding.EMBEDDING_BACKWARD)
        index[embedding.embedding_chunk_sums](m, k, "embedding_chunk_sums", embedding.EMBEDDING_CHUNK_SUMS)
        index[embedding.embedding_chunks_finish](m, k, "embedding_chunks_finish", embedding.EMBEDDING_CHUNKS_FINISH)
        index[rows.gather_rows](m, k, "gather_rows", rows.GATHER_ROWS)
        index[rows.scatter_rows](m, k, "scatter_rows", rows.SCATTER_ROWS)
        index[rows.mse_rows](m, k, "mse_rows", rows.MSE_ROWS)
        elements[adamw.adamw](m, k, "adamw", adamw.ADAMW)
        rows_of[verdict.step_verdict](m, k, "step_verdict", verdict.STEP_VERDICT)
        index[contrastive.pool_forward](m, k, "pool_forward", contrastive.POOL_FORWARD)
        index[contrastive.pool_backward](m, k, "pool_backward", contrastive.POOL_BACKWARD)
        index[contrastive.l2_normalize_forward](m, k, "l2_normalize_forward", contrastive.L2_NORMALIZE_FORWARD)
        index[contrastive.l2_normalize_backward](m, k, "l2_normalize_backward", contrastive.L2_NORMALIZE_BACKWARD)
        index[contrastive.row_temperature](m, k, "row_temperature", contrastive.ROW_TEMPERATURE)
        index[contrastive.pair_loss](m, k, "pair_loss", contrastive.PAIR_LOSS)
        index[contrastive.group_sums](m, k, "group_sums", contrastive.GROUP_SUMS)
        index[late_interaction.maxsim_forward](m, k, "maxsim_forward", late_interaction.MAXSIM_FORWARD)
        index[late_interaction.maxsim_scores](m, k, "maxsim_scores", late_interaction.MAXSIM_SCORES)
        index[late_interaction.maxsim_backward_queries](m, k, "maxsim_backward_queries",
                                                        late_interaction.MAXSIM_BACKWARD_QUERIES)
        index[late_interaction.maxsim_backward_documents](m, k, "maxsim_backward_documents",
                                                          late_interaction.MAXSIM_BACKWARD_DOCUMENTS)
        index[choices.choice_loss](m, k, "choice_loss", choices.CHOICE_LOSS)
        var module = m.finalize()
        module.KERNEL_INTERFACES = k
        module.FACTS = engine_facts()
        return module
    except e:
        abort(String("failed to create module _engine: ", e))
