"""The extension module `uform._engine`: every Python entry point of the engine, in one place.

Python passes buffers as integer addresses on a device (see python/uform/engine.py, which wraps
numpy arrays and device allocations), sizes as integers and scalars as floats. Each kernel is
registered here by one line that names its body and its `Interface` (the names of its operands);
the module exports every interface as KERNEL_INTERFACES and the engine's other facts (op codes,
chunk sizes, compiled head dimensions and attention tile, form codes) as FACTS, which python/uform/kernels.py reads
once. Kernel files under kernels/ hold only math and their launchers.
"""

from std.os import abort
from std.python import Python, PythonObject
from std.python.bindings import PythonModuleBuilder
from engine.device import F32Ptr, f32_at, gpu_device_count
from engine.launch import (
    Args, DevicePtr, ElementBody, GpuTeamBody, Interface, LanesBody, Launcher, RowBody, TeamBody, args_from_python,
    launch_elements, launch_gpu_teams, launch_index, launch_lanes, launch_rows, launch_teams,
)
from engine.plan import (PlannedDevice, device_of, plan_begin, plan_end, plan_free, plan_run,
                         planned_device_of, record_or_launch)
from engine.target import HAS_ACCELERATOR, HAS_NVIDIA
from kernels import (adamw, attention, attention_fast, attention_rows, choices, contrastive, cross_entropy, embedding,
                     gemm, fast_producers, late_interaction, norms, pointwise, rotary, rows, tree_sum, verdict)
from kernels.gemm import fast as gemm_fast, fma as gemm_fma
from kernels.gemm.exact import definition as exact_definition, residues as exact_residues


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
    var planned = planned_device_of(py_self)
    planned[].not_recording("upload")
    planned[].device.upload(Int(py=address), Int(py=offset), Int(py=host), Int(py=size))
    return PythonObject(None)


def device_download(
    py_self: PythonObject, host: PythonObject, address: PythonObject, offset: PythonObject, size: PythonObject
) raises -> PythonObject:
    var planned = planned_device_of(py_self)
    planned[].not_recording("download")
    planned[].device.download(Int(py=host), Int(py=address), Int(py=offset), Int(py=size))
    return PythonObject(None)


def device_copy(py_self: PythonObject, destination: PythonObject, source: PythonObject, size: PythonObject) raises -> PythonObject:
    var planned = planned_device_of(py_self)
    planned[].not_recording("copy")
    planned[].device.copy(Int(py=destination), Int(py=source), Int(py=size))
    return PythonObject(None)


def device_synchronize(py_self: PythonObject) raises -> PythonObject:
    device_of(py_self)[].synchronize()
    return PythonObject(None)


def device_set_gemm_tiling(py_self: PythonObject, tiling: PythonObject) raises -> PythonObject:
    """Force the fma chain's GPU tiling on this device (a code of FACTS' gemm_tilings; -1: its own choice)."""
    device_of(py_self)[].gemm_tiling = Int(py=tiling)
    return PythonObject(None)


def device_plan_begin(py_self: PythonObject) raises -> PythonObject:
    """Record the kernel launches that follow instead of running them (engine.plan)."""
    plan_begin(planned_device_of(py_self))
    return PythonObject(None)


def device_plan_end(py_self: PythonObject, graph: PythonObject) raises -> PythonObject:
    """Keep the recording as a plan (graph: replayed as a device graph on a GPU); answers its id."""
    return PythonObject(plan_end(planned_device_of(py_self), Bool(py=graph)))


def device_plan_run(py_self: PythonObject, id: PythonObject) raises -> PythonObject:
    plan_run(planned_device_of(py_self), Int(py=id))
    return PythonObject(None)


def device_plan_free(py_self: PythonObject, id: PythonObject) raises -> PythonObject:
    plan_free(planned_device_of(py_self), Int(py=id))
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
    facts["exact_gemm_max_k"] = PythonObject(exact_definition.MAX_K)
    facts["exact_residue_alignment"] = PythonObject(exact_residues.RESIDUE_ALIGNMENT)
    var tilings = Python.dict()
    tilings["large"] = PythonObject(gemm_fma.LARGE)
    tilings["large-k16"] = PythonObject(gemm_fma.LARGE_K16)
    tilings["small"] = PythonObject(gemm_fma.SMALL)
    tilings["small-8x8"] = PythonObject(gemm_fma.SMALL_8X8)
    tilings["tiny"] = PythonObject(gemm_fma.TINY)
    facts["gemm_tilings"] = tilings
    var group_forms = Python.dict()
    group_forms["fma"] = PythonObject(gemm.GROUP_FMA)
    group_forms["exact_summed"] = PythonObject(gemm.GROUP_EXACT_SUMMED)
    group_forms["exact_shared_a"] = PythonObject(gemm.GROUP_EXACT_SHARED_A)
    group_forms["apart"] = PythonObject(gemm.GROUP_APART)
    facts["gemm_group_forms"] = group_forms
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
    record_or_launch[launch](planned_device_of(device), Int(py=n), args_from_python(addresses, sizes, scalars))
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


def product[body: gemm.ProductBody](
    device: PythonObject, c: PythonObject, a: PythonObject, b: PythonObject,
    M: PythonObject, N: PythonObject, K: PythonObject,
    transpose_a: PythonObject, transpose_b: PythonObject, accumulate: PythonObject, a16: PythonObject,
    b16: PythonObject, workspace: PythonObject, range_length: PythonObject, splits: PythonObject,
) raises -> PythonObject:
    """C[M×N] (+)= op(A)·op(B) by `body` (kernels/gemm), compiled for each of the layouts A·B, Aᵀ·B and A·Bᵀ."""
    var ta = Bool(py=transpose_a)
    var tb = Bool(py=transpose_b)
    if ta and tb:
        raise Error("gemm: transposing both A and B is not supported")
    var args = gemm.ProductCall(
        f32_at(Int(py=c)), f32_at(Int(py=a)), f32_at(Int(py=b)), Int(py=M), Int(py=N), Int(py=K),
        Bool(py=accumulate), Int(py=a16), Int(py=b16), Int(py=workspace), Int(py=range_length), Int(py=splits),
    ).args()
    var dev = planned_device_of(device)
    if ta:
        record_or_launch[gemm.launch_product[body, True, False]](dev, 1, args)
    elif tb:
        record_or_launch[gemm.launch_product[body, False, True]](dev, 1, args)
    else:
        record_or_launch[gemm.launch_product[body, False, False]](dev, 1, args)
    return PythonObject(None)


def terms_of(values: PythonObject) raises -> gemm.Terms:
    """A Python list of one to GROUP_TERMS integers, as the group's per-term array (zeros past its length)."""
    var terms = Int(py=len(values))
    if terms < 1 or terms > gemm.GROUP_TERMS:
        raise Error("gemm: a group holds 1 to ", gemm.GROUP_TERMS, " products, got ", terms)
    var array = gemm.Terms(fill=0)
    for t in range(terms):
        array[t] = Int(py=values[t])
    return array^


def product_group(
    device: PythonObject, summed: PythonObject, c: PythonObject, a: PythonObject, b: PythonObject, M: PythonObject,
    N: PythonObject, K: PythonObject, x: PythonObject, transpose_a: PythonObject, transpose_b: PythonObject,
    accumulate: PythonObject, workspace: PythonObject, range_length: PythonObject,
) raises -> PythonObject:
    """A group of identical products (kernels/gemm, group_form): c, a, b and x are lists of one to three terms'
    addresses and varying sizes (N_t apart, K_t summed)."""
    var ta = Bool(py=transpose_a)
    var tb = Bool(py=transpose_b)
    if ta and tb:
        raise Error("gemm: transposing both A and B is not supported")
    var args = gemm.group_args(terms_of(c), terms_of(a), terms_of(b), Int(py=M), Int(py=N), Int(py=K), terms_of(x),
                               Int(py=len(c)), Bool(py=summed), Bool(py=accumulate), Int(py=workspace),
                               Int(py=range_length))
    var dev = planned_device_of(device)
    if ta:
        record_or_launch[gemm.launch_product_group[True, False]](dev, 1, args)
    elif tb:
        record_or_launch[gemm.launch_product_group[False, True]](dev, 1, args)
    else:
        record_or_launch[gemm.launch_product_group[False, False]](dev, 1, args)
    return PythonObject(None)


def gemm_group_form(M: PythonObject, N: PythonObject, K: PythonObject, x: PythonObject, summed: PythonObject,
                    one_a: PythonObject, range_length: PythonObject) raises -> PythonObject:
    """The form (gemm.GROUP_*) a group of products of the sizes x runs (gemm.group_form)."""
    return PythonObject(gemm.group_form(Int(py=M), Int(py=N), Int(py=K), terms_of(x), Int(py=len(x)),
                                        Bool(py=summed), Bool(py=one_a), Int(py=range_length)))


def gemm_fast_workspace(M: PythonObject, N: PythonObject, K: PythonObject) raises -> PythonObject:
    """Bytes of the workspace a fast M×N×K product needs for its operands' bf16 copies."""
    return PythonObject(gemm_fast.workspace_bytes(Int(py=M), Int(py=N), Int(py=K)))


def gemm_exact_workspace(
    M: PythonObject, N: PythonObject, K: PythonObject, splits: PythonObject, range_length: PythonObject,
    gpu: PythonObject, fused: PythonObject,
) raises -> PythonObject:
    """Bytes of the workspace an exact product needs in any form (gemm.exact_workspace_bytes)."""
    return PythonObject(gemm.exact_workspace_bytes(Int(py=M), Int(py=N), Int(py=K), Int(py=splits),
                                                   Int(py=range_length), Bool(py=gpu), Bool(py=fused)))


def gemm_shared_a_workspace(M: PythonObject, N: PythonObject, K: PythonObject, range_length: PythonObject,
                            gpu: PythonObject) raises -> PythonObject:
    """Bytes of the workspace of exact products of one A apart over the terms' n in the list N
    (gemm.shared_a_workspace_bytes)."""
    return PythonObject(gemm.shared_a_workspace_bytes(Int(py=M), terms_of(N), Int(py=len(N)), Int(py=K),
                                                      Int(py=range_length), Bool(py=gpu)))


def gemm_summed_workspace(M: PythonObject, N: PythonObject, K: PythonObject, gpu: PythonObject) raises -> PythonObject:
    """Bytes of the workspace of summed exact products (gemm_exact_summed_on) over the terms' k in the list K."""
    return PythonObject(gemm.summed_workspace_bytes(Int(py=M), Int(py=N), terms_of(K), Int(py=len(K)), Bool(py=gpu)))


def gemm_is_exact(M: PythonObject, N: PythonObject, K: PythonObject, range_length: PythonObject) raises -> PythonObject:
    """Whether the identical GEMM runs an M×N×K product (k cut into ranges of range_length, 0 none) exactly
    (gemm.exact_applies)."""
    return PythonObject(gemm.exact_applies(Int(py=M), Int(py=N), Int(py=K), Int(py=range_length)))


def gemm_workspace(M: PythonObject, N: PythonObject, K: PythonObject, transpose_a: PythonObject,
                   range_length: PythonObject, gpu: PythonObject, fma_only: PythonObject) raises -> PythonObject:
    """Bytes of the workspace the identical GEMM needs for an M×N×K product (gemm.identical_workspace_bytes)."""
    return PythonObject(gemm.identical_workspace_bytes(Int(py=M), Int(py=N), Int(py=K), Bool(py=transpose_a),
                                                       Int(py=range_length), Bool(py=gpu), Bool(py=fma_only)))


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
            m.add_type[PlannedDevice]("Device")
            .def_init_defaultable[PlannedDevice]()
            .def_method[device_open]("open")
            .def_method[device_ordinal]("ordinal")
            .def_method[device_alloc]("alloc")
            .def_method[device_free]("free")
            .def_method[device_upload]("upload")
            .def_method[device_download]("download")
            .def_method[device_copy]("copy")
            .def_method[device_synchronize]("synchronize")
            .def_method[device_set_gemm_tiling]("set_gemm_tiling")
            .def_method[device_plan_begin]("plan_begin")
            .def_method[device_plan_end]("plan_end")
            .def_method[device_plan_run]("plan_run")
            .def_method[device_plan_free]("plan_free")
        )
        m.def_function[gpu_count]("gpu_count")
        m.def_function[has_accelerator]("has_accelerator")
        m.def_function[product[gemm.identical_product]]("gemm")
        m.def_function[product[gemm.fma_product]]("gemm_fma")
        m.def_function[gemm_workspace]("gemm_workspace")
        m.def_function[product_group]("gemm_group")
        m.def_function[gemm_summed_workspace]("gemm_summed_workspace")
        m.def_function[gemm_shared_a_workspace]("gemm_shared_a_workspace")
        m.def_function[product[gemm.exact_product]]("gemm_exact")
        m.def_function[product[gemm.exact_residue_product]]("gemm_exact_residues")
        m.def_function[product[gemm.exact_fused_product]]("gemm_exact_fused")
        m.def_function[gemm_exact_workspace]("gemm_exact_workspace")
        m.def_function[gemm_is_exact]("gemm_is_exact")
        m.def_function[gemm_group_form]("gemm_group_form")
        m.def_function[product[gemm.fast_product]]("gemm_fast")
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
