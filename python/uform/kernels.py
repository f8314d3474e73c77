"""Every engine kernel, callable on device buffers.

These are thin, checked wrappers over ``uform._engine``: they verify that the
buffers live on one device and hold the sizes the kernel reads, then pass
addresses and sizes down. The trainers compose them; the tests call them on
numpy data through :meth:`uform.Device.put` and :meth:`uform.Buffer.numpy`.
The math of each kernel is written beside its body in ``mojo/kernels/``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections import defaultdict

import numpy as np

from ._loader import load_cublas
from .engine import Buffer, _engine
from .errors import ErrorCode, UFormRuntimeError

FACTS = _engine.FACTS  # the engine's constants, defined once in mojo/kernels/
UNARY_OPS = {name: code for code, name in enumerate(FACTS["unary_ops"])}  # op → code of unary_math
COLUMN_CHUNK = FACTS["column_chunk"]  # rows per partial sum of `column_sum`
EMBEDDING_CHUNK = FACTS["embedding_chunk"]  # tokens per partial sum of `embedding_backward_chunked`
ATTENTION_HEAD_DIMS = tuple(FACTS["attention_head_dims"])
ATTENTION_TILE = FACTS["attention_tile"]  # tokens of one attention task (a tile of queries or of keys)
ATTENTION_ROWS_MAX_TEAMS = FACTS["attention_rows_max_teams"]  # fewer teams than this: attention by rows
ATTENTION_FAST_HEAD_DIMS = tuple(FACTS["attention_fast_head_dims"])  # head dims with fast-mode (bf16) kernels
ATTENTION_FAST_TILE = FACTS["attention_fast_tile"]  # tokens of one fast-mode attention task
FORM_WEIGHTED_SIGMOID = FACTS["form_weighted_sigmoid"]  # SIGMOID and BALANCED: weights fold the normalisation
FORM_RANKED = FACTS["form_ranked"]
EXACT_GEMM_MAX_K = FACTS["exact_gemm_max_k"]  # the longest contraction the exact GEMM's definition covers
EXACT_RESIDUE_ALIGNMENT = FACTS["exact_residue_alignment"]  # k a residue line is padded to a multiple of
GEMM_GROUP_FORMS = FACTS["gemm_group_forms"]  # a group of products' forms: fma, exact_summed, exact_shared_a, apart
CAST_LANES = FACTS["cast_lanes"]  # values one task of cast_bf16 rounds
ROTARY_PAIRS_PER_TASK = FACTS["rotary_pairs_per_task"]  # pairs of a head vector one rotary task rotates
NORM_EPSILON = FACTS["norm_epsilon"]  # added to Σe² under the square root of l2_normalize
LARGEST_SQUARABLE = FACTS["largest_squarable"]  # √(largest float32): the largest |g| whose g² float32 holds


def _launcher(kernel: str, buffers: str, sizes: str, scalars: str):
    """The launch function of one kernel, made from its interface: `<kernel>(n, *, <its operand names>)`.

    Its keyword parameters are the kernel's operand names as the engine declares them (buffers default to
    None, sizes to 0, scalars to 0.0), so Python never writes a slot number; an unknown name is a TypeError.
    Written out once as source so that a launch costs a call, not a loop over names."""
    buffers, sizes, scalars = buffers.split(), sizes.split(), scalars.split()
    parameters = [f"{name}=None" for name in buffers] + [f"{name}=0" for name in sizes] + \
                 [f"{name}=0.0" for name in scalars]
    source = (
        f"def {kernel}(n, *, {', '.join(parameters)}):\n"
        f"    device = _device_of(({''.join(name + ', ' for name in buffers)}))\n"
        f"    _call({kernel!r}, function, device, int(n),\n"
        f"          [{', '.join(f'0 if {name} is None else {name}.address' for name in buffers)}],\n"
        f"          [{', '.join(f'int({name})' for name in sizes)}],\n"
        f"          [{', '.join(f'float({name})' for name in scalars)}])\n"
    )
    namespace = {"_device_of": _device_of, "_call": _call, "function": getattr(_engine, kernel)}
    exec(source, namespace)
    return namespace[kernel]


_profile: dict[str, list[float]] | None = None


@contextlib.contextmanager
def profile():
    """Time every kernel launched inside the block (each launch then waits for its device):
    yields {kernel name: [calls, seconds]}. For finding where a step's time goes, not for speed."""
    global _profile
    _profile = defaultdict(lambda: [0, 0.0])
    try:
        yield _profile
    finally:
        _profile = None


class EngineError(RuntimeError):
    """A kernel the engine could not run: the device's state is unknown after it."""


def loses_the_device(error: BaseException) -> bool:
    """Whether an error raised by a call that works on a device leaves the device's state unknown: the one rule of
    both trainers. The engine's own failures do (an EngineError, or the plain Exception its bindings raise); a
    refusal, a failed allocation and an error of the caller's own (its generator's, say) happen before anything on
    the device changes, and pass through."""
    return isinstance(error, EngineError) or type(error) is Exception


@contextlib.contextmanager
def device_work(device_name: str, lost):
    """Run device work under both trainers' one failure model: an error that loses the device
    (``loses_the_device``) calls `lost()` (the trainer marks its state unknown) and raises DEVICE_LOST naming the
    device and the error; every other error passes through as it is."""
    try:
        yield
    except Exception as error:
        if not loses_the_device(error):
            raise
        lost()
        raise UFormRuntimeError(ErrorCode.DEVICE_LOST, f"{device_name}: the engine failed, so the device state is "
                                                       f"unknown; the session is lost: {error}") from error


def _run(kernel: str, function, device, args) -> None:
    try:
        with device.lock:  # a plan recording on this device from another thread records its own launches alone
            function(device._handle, *args)
    except Exception as error:  # the engine raises plain Exceptions; name the device and the call
        raise EngineError(f"{device.name}: kernel {kernel} failed: {error}") from error


def _call(kernel: str, function, device, *args, label: str | None = None) -> None:
    """Run engine `function` (named `kernel`) on `device`; inside profile(), timed under `label` (default: kernel)."""
    if _profile is None:
        _run(kernel, function, device, args)
        return
    device.synchronize()
    start = time.perf_counter()
    _run(kernel, function, device, args)
    device.synchronize()
    entry = _profile[label or kernel]
    entry[0] += 1
    entry[1] += time.perf_counter() - start


def _device_of(buffers: tuple):
    """The one device the given buffers (None: absent) live on."""
    device = None
    for buffer in buffers:
        if buffer is None:
            continue
        if device is None:
            device = buffer.device
        elif buffer.device is not device:
            raise ValueError(f"buffers live on different devices: {device.name} and {buffer.device.name}")
    return device


def _expect(buffer: Buffer, name: str, size: int, dtype=np.float32) -> None:
    if buffer.dtype != np.dtype(dtype):
        raise TypeError(f"{name} must be {np.dtype(dtype)}, got {buffer.dtype}")
    if buffer.size != size:
        raise ValueError(f"{name} must hold {size} values, holds {buffer.size} (shape {buffer.shape})")


def _expect_aligned(*buffers: Buffer) -> None:
    """Attention moves rows of 4 floats at a time: each buffer must start on a 16-byte boundary (a view's
    offset a multiple of 4 floats)."""
    for buffer in buffers:
        if buffer.address % 16:
            raise ValueError(f"attention operands must start on 16 bytes; a buffer at {buffer.address:#x} does not "
                             "(view at a multiple of 4 floats)")


_LAUNCHERS = {kernel: _launcher(kernel, *names) for kernel, names in _engine.KERNEL_INTERFACES.items()}


def _launch(kernel: str, n: int, **operands) -> None:
    """Run kernel over tasks [0, n) with its operands by name: Buffers (None: absent), sizes, float scalars."""
    _LAUNCHERS[kernel](n, **operands)


# ---- element-wise --------------------------------------------------------------------------

def unary(op: str, y: Buffer, x: Buffer) -> None:
    """y = op(x) element-wise with the engine's portable math (see UNARY_OPS)."""
    if op not in UNARY_OPS:
        raise ValueError(f"unknown unary op {op!r}; choose one of {sorted(UNARY_OPS)}")
    _expect(y, "y", x.size)
    _launch("unary_math", x.size, y=y, x=x, op=UNARY_OPS[op])


def silu(y: Buffer, x: Buffer) -> None:
    """y = silu(x) = x·σ(x): unary("silu", …)'s bits, by a kernel of its own."""
    _expect(y, "y", x.size)
    _launch("silu", x.size, y=y, x=x)


def silu_backward(dx: Buffer, x: Buffer, dy: Buffer) -> None:
    """dx = dy · silu'(x)."""
    _expect(dx, "dx", x.size)
    _expect(dy, "dy", x.size)
    _launch("silu_backward", x.size, dx=dx, x=x, dy=dy)


def add(y: Buffer, a: Buffer, b: Buffer) -> None:
    """y = a + b (y may be a or b)."""
    _expect(y, "y", a.size)
    _expect(b, "b", a.size)
    _launch("add", a.size, y=y, a=a, b=b)


def silu_bf16(y16: Buffer, x: Buffer) -> None:
    """Fast mode: y16 = bf16(silu(x)) (the bits of ``cast_bf16`` after ``silu``; kernels/fast_producers.mojo)."""
    _expect(y16, "y16", x.size, np.uint16)
    _launch("silu_bf16", -(-x.size // CAST_LANES), y16=y16, x=x, count=x.size)


def silu_backward_bf16(dx16: Buffer, x: Buffer, dy: Buffer) -> None:
    """Fast mode: dx16 = bf16(dy · silu'(x)) (the bits of ``cast_bf16`` after ``silu_backward``)."""
    _expect(dx16, "dx16", x.size, np.uint16)
    _expect(dy, "dy", x.size)
    _launch("silu_backward_bf16", -(-x.size // CAST_LANES), dx16=dx16, x=x, dy=dy, count=x.size)


def scale(y: Buffer, x: Buffer, alpha: float) -> None:
    _expect(y, "y", x.size)
    _launch("scale", x.size, y=y, x=x, alpha=alpha)


def fill(y: Buffer, value: float) -> None:
    """y = value everywhere (y may be a view)."""
    _launch("fill", y.size, y=y, value=value)


# ---- GEMM ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def gemm_is_exact(m: int, n: int, k: int, k_range: int = 0) -> bool:
    """Whether the identical GEMM (``gemm``) runs an m×n×k product as the exact GEMM, by the canonical shape rule
    (k, or the k range's length, from 512 to 2^20, and m and n at least 512; docs/numerics.md), rather than the fma
    chain. The same answer on every device."""
    return bool(_engine.gemm_is_exact(m, n, k, int(k_range)))


@functools.lru_cache(maxsize=4096)
def _gemm_workspace_bytes(m: int, n: int, k: int, transpose_a: bool, k_range: int, gpu: bool, fma_only: bool) -> int:
    """Bytes of the workspace an identical product needs: the rule's form's (``gemm``), or the fma chain's
    (``gemm_fma``)."""
    return int(_engine.gemm_workspace(m, n, k, bool(transpose_a), int(k_range), bool(gpu), bool(fma_only)))


@functools.lru_cache(maxsize=4096)
def _gemm_group_form(m: int, n: int, k: int, sizes: tuple[int, ...], summed: bool, one_a: bool, k_range: int) -> int:
    """The form (a value of GEMM_GROUP_FORMS) a group of products runs, as the engine decides it (mojo/kernels/gemm,
    group_form): sizes are the terms' k summed, their n apart; one_a whether they share one A."""
    return int(_engine.gemm_group_form(m, n, k, list(sizes), bool(summed), bool(one_a), int(k_range)))


@functools.lru_cache(maxsize=1024)
def _gemm_summed_workspace_bytes(m: int, n: int, ks: tuple[int, ...], gpu: bool) -> int:
    """Bytes of the workspace of summed exact products over the terms' k (``gemm_group``)."""
    return int(_engine.gemm_summed_workspace(m, n, list(ks), bool(gpu)))


@functools.lru_cache(maxsize=1024)
def _gemm_shared_a_workspace_bytes(m: int, ns: tuple[int, ...], k: int, k_range: int, gpu: bool) -> int:
    """Bytes of the workspace of exact products of one A apart (``gemm_group``): the largest product's, or where
    the engine joins their columns (their k ranges run together: a Hopper GPU, equal ranges of whole stages), the
    joined product's."""
    return int(_engine.gemm_shared_a_workspace(m, list(ns), k, int(k_range), bool(gpu)))


def _overlap(x: Buffer, y: Buffer) -> bool:
    """Whether two buffers (or views) of one device share any byte."""
    return x.address < y.address + y.nbytes and y.address < x.address + x.nbytes


def _gemm_operands(what: str, c: Buffer, a: Buffer | None, b: Buffer | None, m: int, n: int, k: int,
                   transpose_a: bool, transpose_b: bool, a16: Buffer | None = None, b16: Buffer | None = None):
    """The device of a product's operands, after checking its form and their sizes (and those of the bf16 copies
    given; an operand may be None only where its copy stands in)."""
    if transpose_a and transpose_b:
        raise ValueError(f"{what} supports A·B, Aᵀ·B and A·Bᵀ, not Aᵀ·Bᵀ")
    if min(m, n, k) < 1:
        raise ValueError(f"{what} sizes must be positive, got m={m}, n={n}, k={k}")
    device = _device_of((c, a, b, a16, b16))
    for name, operand, copy, size in (("A", a, a16, m * k), ("B", b, b16, k * n)):
        if operand is None and copy is None:
            raise ValueError(f"{what}: operand {name} is missing")
        if operand is not None:
            _expect(operand, name, size)
        if copy is not None:
            _expect(copy, name.lower() + "16", size, np.uint16)
    _expect(c, "C", m * n)
    return device


def _scratch_bytes(device, nbytes: int) -> Buffer:
    """The device's shared workspace (Device.scratch), at least `nbytes` long."""
    return device.scratch(-(-nbytes // 4))


def gemm_exact(c: Buffer, a: Buffer, b: Buffer, m: int, n: int, k: int, *,
               transpose_a: bool = False, transpose_b: bool = False, accumulate: bool = False,
               residues: bool | str = False, splits: int = 0, k_range: int = 0) -> None:
    """C[m×n] (+)= op(A)·op(B) as the exact GEMM defines it (docs/numerics.md, mojo/kernels/gemm/exact/): the
    operands cut to fixed point from their rows' and columns' exponents, summed exactly, rounded once. The
    identical GEMM (``gemm``) runs it where ``gemm_is_exact``; layouts as ``gemm``, and k_range as there (Aᵀ·B,
    the residue forms: each range its own exact product, the ranges combined by the row tree).
    Three forms, the same bits: the limb form (``residues=False``),
    the residue form (``True``: on a GPU int8 residue planes, their products on cuBLAS, then the reconstruction;
    on the CPU int16 residue planes and AVX2, the fastest exact form there) and ``residues="fused"``, whose plane
    products and reconstruction run in one kernel on a Hopper GPU (no int32 planes in memory), k split into
    ``splits`` ranges (0: the kernel's own choice, which leaves to the unfused form the products whose k the kernel
    would split: fused_pays in mojo/kernels/gemm/exact/fused_sm90.mojo; the bits never depend on it); the CPU has
    no fused kernel and runs its residue form for it."""
    for name, value in (("splits", splits), ("k_range", k_range)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"gemm_exact: {name} must be an int >= 0, got {value!r}")
    if (k_range if 0 < k_range < k else k) > EXACT_GEMM_MAX_K:
        raise ValueError(f"gemm_exact covers k up to {EXACT_GEMM_MAX_K} (a k range's length, in ranges), got k={k}"
                         + (f" in ranges of {k_range}" if k_range else ""))
    forms = {False: _engine.gemm_exact, True: _engine.gemm_exact_residues, "fused": _engine.gemm_exact_fused}
    product = forms.get(residues)
    if product is None:
        raise ValueError(f"gemm_exact: residues must be False, True or 'fused', got {residues!r}")
    if k_range and (not transpose_a or transpose_b or residues is False):
        raise ValueError(f"gemm_exact: k_range must be 0, or positive for an Aᵀ·B product in a residue form, "
                         f"got {k_range}")
    if k_range and splits:
        raise ValueError("gemm_exact: splits and k_range exclude each other (each k range is a product unsplit)")
    device = _gemm_operands("gemm_exact", c, a, b, m, n, k, transpose_a, transpose_b)
    if residues and device.is_gpu:
        load_cublas()  # the residue planes' products run on cuBLAS's int8 GEMM (the fused form's too, at times)
    workspace = _scratch_bytes(device, _engine.gemm_exact_workspace(m, n, k, splits, k_range, device.is_gpu,
                                                                    residues == "fused"))
    _call("gemm_exact", product, device, c.address, a.address, b.address, m, n, k, bool(transpose_a),
          bool(transpose_b), bool(accumulate), 0, 0, workspace.address, k_range, splits)


def cast_bf16(y: Buffer, x: Buffer) -> None:
    """y = x rounded to bfloat16 (to nearest, ties to even), y a uint16 buffer of the bf16 bits."""
    _expect(x, "x", x.size)
    _expect(y, "y", x.size, np.uint16)
    _launch("cast_bf16", -(-x.size // CAST_LANES), y=y, x=x, count=x.size)


def gemm(c: Buffer, a: Buffer | None, b: Buffer | None, m: int, n: int, k: int, *,
         transpose_a: bool = False, transpose_b: bool = False, accumulate: bool = False, fast: bool = False,
         a16: Buffer | None = None, b16: Buffer | None = None, k_range: int = 0) -> None:
    """C[m×n] (+)= op(A)·op(B); A is m×k (k×m if transpose_a), B is k×n (n×k if transpose_b).

    The identical GEMM: the exact GEMM (``gemm_exact``: one rounding of the exact sum; on a Hopper GPU its fused
    form) where the canonical shape rule takes the product (``gemm_is_exact``), else the fma chain of
    mojo/kernels/gemm/fma.mojo; the same bits on every device either way (docs/numerics.md).

    k_range > 0 (Aᵀ·B only): k cut into ranges of that length (a packed row, or a block of rows), each its own
    product (an exact one, or an fma chain, by the rule applied to the range's length), combined by the row tree
    (``tree_sum``), so devices holding aligned blocks of rows can sum their own and combine (docs/mesh.md); 0: the
    canonical rule. Fast products ignore it.

    fast=True on a GPU: fast mode's bf16 tensor-core product (mojo/kernels/gemm/fast.mojo), reading A's and B's bf16
    copies from a16 and b16 when given (``cast_bf16`` of A and of B, or a fast producer's copy, made once for
    several products) and rounding them itself otherwise; an operand given by its copy alone may be None. On the
    CPU, fast mode runs this identical GEMM on the fp32 operands and ignores the copies."""
    device = c.device
    label = "gemm" + ("_at" if transpose_a else "_bt" if transpose_b else "")
    if fast and device.is_gpu:
        _gemm_operands("gemm", c, a, b, m, n, k, transpose_a, transpose_b, a16, b16)
        load_cublas()  # once per process; raises OSError naming where it looked
        workspace = _scratch_bytes(device, _engine.gemm_fast_workspace(m, n, k))
        _call("gemm_fast", _engine.gemm_fast, device, c.address, 0 if a is None else a.address,
              0 if b is None else b.address, m, n, k, bool(transpose_a), bool(transpose_b), bool(accumulate),
              0 if a16 is None else a16.address, 0 if b16 is None else b16.address, workspace.address, 0, 0,
              label=label + "_fast")
        return
    _identical_product(_engine.gemm, label, c, a, b, m, n, k, transpose_a, transpose_b, accumulate, k_range)


def gemm_fma(c: Buffer, a: Buffer, b: Buffer, m: int, n: int, k: int, *, transpose_a: bool = False,
             transpose_b: bool = False, accumulate: bool = False, k_range: int = 0) -> None:
    """The fma chain of mojo/kernels/gemm/fma.mojo (each output one fma chain in the canonical order, k ranges as
    ``gemm`` takes them) whatever the shape: what ``gemm`` runs below the exact GEMM's shape rule, here for
    benchmarks and tests of the chain at any size."""
    label = "gemm_fma" + ("_at" if transpose_a else "_bt" if transpose_b else "")
    _identical_product(_engine.gemm_fma, label, c, a, b, m, n, k, transpose_a, transpose_b, accumulate, k_range)


def _check_k_range(what: str, k_range: int, transpose_a: bool) -> None:
    """k_range is 0, or positive for Aᵀ·B products (``gemm``)."""
    if k_range < 0 or (k_range and not transpose_a):
        raise ValueError(f"{what}: k_range must be 0, or positive for an Aᵀ·B product, got {k_range}")


def _identical_product(entry, label: str, c: Buffer, a: Buffer, b: Buffer, m: int, n: int, k: int,
                       transpose_a: bool, transpose_b: bool, accumulate: bool, k_range: int) -> None:
    """An identical-mode product by the engine's `entry`: gemm (the shape rule's choice) or gemm_fma."""
    device = _gemm_operands("gemm", c, a, b, m, n, k, transpose_a, transpose_b)
    _check_k_range("gemm", k_range, transpose_a)
    fma_only = entry is _engine.gemm_fma
    nbytes = _gemm_workspace_bytes(m, n, k, bool(transpose_a), int(k_range), device.is_gpu, fma_only)
    exact = not fma_only and gemm_is_exact(m, n, k, int(k_range))
    workspace = _scratch_bytes(device, nbytes).address if nbytes else 0
    if exact:
        label += "_exact"
    if k_range:
        label += "_rows"
    elif nbytes and not exact:  # the fma chain's partial sums: k split by the canonical rule
        label += "_split_k"
    _call("gemm", entry, device, c.address, a.address, b.address, m, n, k, bool(transpose_a), bool(transpose_b),
          bool(accumulate), 0, 0, workspace, int(k_range), 0, label=label)


def gemm_group(cs: list[Buffer], as_: list[Buffer], bs: list[Buffer], m: int, ns: list[int], ks: list[int], *,
               transpose_a: bool = False, transpose_b: bool = False, accumulate: bool = False, summed: bool = False,
               k_range: int = 0) -> None:
    """Up to three identical products in one call. Apart, C_t (+)= op(A_t)·op(B_t) for each t (one k, the sizes
    n_t), each with the bits it has launched alone (``gemm``). Summed (one C and n, the sizes k_t), the product of
    the terms' operands joined along k, C (+)= [op(A_0) op(A_1) …]·[op(B_0); op(B_1); …]: where the exact GEMM's
    shape rule takes the joined m × n × Σk_t product (``gemm_is_exact``), one exact product with one rounding, the
    bits of ``gemm`` on the joined operands (gemm_exact_summed_on); else the fma chain's C (+)= op(A_0)·op(B_0),
    then C += op(A_t)·op(B_t) in order, as ``gemm`` calls with accumulate after the first.
    On a GPU, small products (a few tiles each, whose time is their launch) run as one launch; otherwise one
    after another (mojo/kernels/gemm/fma.mojo, gemm_group_on). Products apart that the exact GEMM's shape rule takes
    run one after another too, by ``gemm``, unless all of them are exact and of one A (q, k and v of one input,
    their weight gradients): then one call, which on a GPU finds A's residue planes once where it finds them for a
    whole product (gemm_exact_shared_a_on: unranged, or k ranges of whole stages run together), and runs products
    whose k ranges run together as one product of their B's columns joined, so that their blocks share the GPU's
    waves (the same bits: an output's exact sum and rounding are its row's and column's alone).
    Layouts and k_range as ``gemm`` (summed exact products take no k ranges)."""
    terms = len(cs)
    if not 1 <= terms <= 3 or not len(as_) == len(bs) == len(ns) == len(ks) == terms:
        raise ValueError(f"gemm_group takes 1 to 3 products with one C, A, B, n and k each, got {terms} C")
    if summed and (any(c is not cs[0] for c in cs) or len(set(ns)) != 1):
        raise ValueError("gemm_group: summed products share their C and n")
    if not summed and len(set(ks)) != 1:
        raise ValueError("gemm_group: products apart share k")
    _check_k_range("gemm_group", k_range, transpose_a)
    device = None
    for c, a, b, n, k in zip(cs, as_, bs, ns, ks):
        on = _gemm_operands("gemm_group", c, a, b, m, n, k, transpose_a, transpose_b)
        if device is not None and on is not device:
            raise ValueError(f"gemm_group: products on different devices: {device.name} and {on.name}")
        device = on
    distinct_cs = cs[:1] if summed else cs
    if any(_overlap(c, x) for c in distinct_cs for x in (*as_, *bs)) or \
            any(_overlap(c, d) for i, c in enumerate(distinct_cs) for d in distinct_cs[i + 1:]):
        raise ValueError("gemm_group: each C must be a buffer of its own, apart from every A and B (the products "
                         "of one launch run at once)")
    label = "gemm_group" + ("_at" if transpose_a else "_bt" if transpose_b else "")
    varying = ks if summed else ns
    form = _gemm_group_form(m, ns[0], ks[0], tuple(varying), bool(summed),
                            all(a.address == as_[0].address for a in as_), int(k_range))
    if form == GEMM_GROUP_FORMS["exact_summed"]:  # one exact product over the joined k
        if k_range:
            raise ValueError("gemm_group: summed exact products take no k ranges")
        step = EXACT_RESIDUE_ALIGNMENT
        if sum(-(-k // step) * step for k in ks) > EXACT_GEMM_MAX_K:
            raise ValueError(f"gemm_group: summed exact products join k up to {EXACT_GEMM_MAX_K}, each term's k "
                             f"rounded up to {step}, got {list(ks)}")
        label += "_exact_summed"
        nbytes = _gemm_summed_workspace_bytes(m, ns[0], tuple(ks), device.is_gpu)
    else:
        if form == GEMM_GROUP_FORMS["apart"]:
            for c, a, b, n in zip(cs, as_, bs, ns):  # the exact GEMM's products apart run alone
                gemm(c, a, b, m, n, ks[0], transpose_a=transpose_a, transpose_b=transpose_b, accumulate=accumulate,
                     k_range=k_range)
            return
        if form == GEMM_GROUP_FORMS["exact_shared_a"]:  # products of one A: their shared workspace
            label += "_exact" + ("_rows" if k_range else "")
            nbytes = _gemm_shared_a_workspace_bytes(m, tuple(ns), ks[0], int(k_range), device.is_gpu)
        else:  # the largest of the fma chains' partial sums (a product cut into k ranges), which serves each in turn
            nbytes = max(_gemm_workspace_bytes(m, n, k, bool(transpose_a), int(k_range), device.is_gpu, True)
                         for n, k in zip(ns, ks))
    workspace = _scratch_bytes(device, nbytes).address if nbytes else 0
    _call("gemm_group", _engine.gemm_group, device, bool(summed), [c.address for c in cs],
          [a.address for a in as_], [b.address for b in bs], m, ns[0], ks[0], varying, bool(transpose_a),
          bool(transpose_b), bool(accumulate), workspace, int(k_range), label=label)


# ---- rows ------------------------------------------------------------------------------------

def rmsnorm_forward(y: Buffer, rstd: Buffer, x: Buffer, weight: Buffer, eps: float, *, residual: Buffer | None = None,
                    h: Buffer | None = None) -> None:
    """y = x / √(mean(x²) + eps) · weight over rows of width weight.size; rstd keeps 1/√(…). With a residual, the
    norm of h = x + residual, written to h in the same pass: the bits of ``add(h, x, residual)`` then the norm
    of h."""
    width = weight.size
    rows = x.size // width
    _expect(x, "x", rows * width)
    _expect(y, "y", rows * width)
    _expect(rstd, "rstd", rows)
    if (residual is None) != (h is None):
        raise ValueError("rmsnorm_forward takes residual and h together")
    if residual is not None:
        _expect(residual, "residual", rows * width)
        _expect(h, "h", rows * width)
    _launch("rmsnorm_forward", rows, y=y, rstd=rstd, x=x, weight=weight, residual=residual, h=h, width=width,
            eps=eps)


def rmsnorm_backward(dx: Buffer, dweight_rows: Buffer, dy: Buffer, x: Buffer, weight: Buffer, rstd: Buffer, *,
                     accumulate: bool = False) -> None:
    """dx of RMSNorm (accumulate: dx += it, in the same pass: the bits of the norm's dx, then ``add(dx, dx, ·)``),
    and dweight_rows = dy·x·rstd per row (sum it with column_sum for dweight)."""
    width = weight.size
    rows = x.size // width
    for name, buffer in (("dx", dx), ("dweight_rows", dweight_rows), ("dy", dy)):
        _expect(buffer, name, rows * width)
    _expect(rstd, "rstd", rows)
    _launch("rmsnorm_backward", rows, dx=dx, dweight_rows=dweight_rows, dy=dy, x=x, weight=weight, rstd=rstd,
            width=width, accumulate=accumulate)


def rmsnorm_bf16(y16: Buffer, rstd: Buffer, x: Buffer, weight: Buffer, eps: float, *, residual: Buffer | None = None,
                 h: Buffer | None = None) -> None:
    """Fast mode's RMSNorm into bf16 (kernels/fast_producers.mojo): on h = x + residual (x alone without a
    residual), y16 = bf16(rmsnorm(h)·weight) and rstd as ``rmsnorm_forward`` writes them; h, when given, keeps
    the fp32 sum. The bits of ``add``, ``rmsnorm_forward`` and ``cast_bf16`` in turn."""
    width = weight.size
    rows = x.size // width
    _expect(x, "x", rows * width)
    _expect(y16, "y16", rows * width, np.uint16)
    _expect(rstd, "rstd", rows)
    for name, buffer in (("residual", residual), ("h", h)):
        if buffer is not None:
            _expect(buffer, name, rows * width)
    _launch("rmsnorm_bf16", rows, y16=y16, rstd=rstd, h=h, x=x, residual=residual, weight=weight, width=width,
            eps=eps)


def rmsnorm_backward_bf16(dh: Buffer, dh16: Buffer, dweight_rows: Buffer, dy: Buffer, x: Buffer, weight: Buffer,
                          rstd: Buffer) -> None:
    """Fast mode: RMSNorm's dx (of dy at its output) added into dh in place, with dh's bf16 copy in dh16, and
    dweight_rows as ``rmsnorm_backward`` writes it. The bits of ``rmsnorm_backward``, ``add`` and ``cast_bf16``."""
    width = weight.size
    rows = x.size // width
    for name, buffer in (("dh", dh), ("dweight_rows", dweight_rows), ("dy", dy)):
        _expect(buffer, name, rows * width)
    _expect(dh16, "dh16", rows * width, np.uint16)
    _expect(rstd, "rstd", rows)
    _launch("rmsnorm_backward_bf16", rows, dh=dh, dh16=dh16, dweight_rows=dweight_rows, dy=dy, x=x, weight=weight,
            rstd=rstd, width=width)


def softmax_forward(y: Buffer, x: Buffer, width: int) -> None:
    _expect(y, "y", x.size)
    _launch("softmax_forward", x.size // width, y=y, x=x, width=width)


def softmax_backward(dx: Buffer, y: Buffer, dy: Buffer, width: int) -> None:
    _expect(dx, "dx", y.size)
    _expect(dy, "dy", y.size)
    _launch("softmax_backward", y.size // width, dx=dx, y=y, dy=dy, width=width)


def cross_entropy(losses: Buffer, dlogits: Buffer | None, logits: Buffer, targets: Buffer, grad_scale: float = 1.0) -> None:
    """Per row: loss = logsumexp(z) − z[target]; dlogits = (softmax(z) − onehot)·grad_scale. Target < 0 is ignored."""
    rows = targets.size
    vocab = logits.size // rows
    _expect(targets, "targets", rows, np.int32)
    _expect(logits, "logits", rows * vocab)
    _expect(losses, "losses", rows)
    if dlogits is not None:
        _expect(dlogits, "dlogits", rows * vocab)
    _launch("cross_entropy", rows, losses=losses, dlogits=dlogits, logits=logits, targets=targets, vocab=vocab,
            grad_scale=grad_scale)


def column_sum_workspace(device, rows: int, columns: int, row_length: int = 0) -> Buffer:
    """The partial sums buffer column_sum needs for this geometry."""
    return device.empty((-(-rows // (row_length or COLUMN_CHUNK)), columns))


def column_sum(out: Buffer, x: Buffer, rows: int, columns: int, *, accumulate: bool = False,
               partial: Buffer | None = None, row_length: int = 0, squares: bool = False) -> None:
    """out[c] (+)= Σ_r x[r, c], in two fixed stages: sums of COLUMN_CHUNK rows added in the canonical order, or,
    with row_length, sums of each packed row's row_length tokens combined by the row tree (``tree_sum``).
    partial: a reusable workspace (``column_sum_workspace``). squares: Σ_r x[r, c]² instead, each square rounded
    to float32 and summed in the same order."""
    _expect(x, "x", rows * columns)
    _expect(out, "out", columns)
    chunk = row_length or COLUMN_CHUNK
    chunks = -(-rows // chunk)
    if partial is None:
        partial = column_sum_workspace(out.device, rows, columns, row_length)
    _expect(partial, "partial", chunks * columns)
    _launch("column_partial_sums", chunks * columns, partial=partial, x=x, rows=rows, columns=columns, chunk=chunk,
            squares=squares)
    if row_length:
        tree_sum(out, partial, chunks, accumulate=accumulate)
    else:
        _launch("column_sums_finish", columns, out=out, partial=partial, chunks=chunks, columns=columns,
                accumulate=accumulate)


def tree_sum(out: Buffer, partials: Buffer, count: int, *, accumulate: bool = False) -> None:
    """out (+)= T(partials[0], …, partials[count − 1]) element-wise: the row tree (kernels/tree_sum.mojo) over
    `count` partial sums of out's size, one per packed row."""
    _expect(partials, "partials", count * out.size)
    _launch("tree_sum", out.size, out=out, partials=partials, size=out.size, count=count, accumulate=accumulate)


# ---- attention -------------------------------------------------------------------------------------

def _attention_tile_count(spans: Buffer, tiles: Buffer | None, tokens: int) -> int:
    """How many tiles a tile table holds (0 without one), checked to lie right after the spans in memory, where
    the team kernels read it (their interface has no address left for it)."""
    if tiles is None:
        return 0
    count = tiles.size // 2
    _expect(tiles, "tiles", 2 * count, np.int32)  # whole (start, end) pairs
    if tiles.address != spans.address + spans.nbytes or not 0 < count <= tokens:
        raise ValueError(f"attention tiles must be (T, 2) int32 with 0 < T ≤ {tokens}, right after the spans in one "
                         f"allocation; got {tiles.shape} at {tiles.address:#x}, the spans ending at "
                         f"{spans.address + spans.nbytes:#x}")
    return count


def _attention_sizes(q: Buffer, k: Buffer, spans: Buffer, heads: int, kv_heads: int, head_dim: int) -> int:
    if head_dim not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not compiled; use one of {ATTENTION_HEAD_DIMS}")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    tokens = q.size // (heads * head_dim)
    _expect(q, "q", tokens * heads * head_dim)
    _expect_aligned(q, k)
    _expect(k, "k", tokens * kv_heads * head_dim)
    _expect(spans, "spans", tokens * 2, np.int32)
    return tokens


def _attention_geometry(tokens: int, heads: int, kv_heads: int, head_dim: int, causal: bool) -> dict:
    return dict(tokens=tokens, heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=causal,
                scale=head_dim ** -0.5)


def _attention_form(fast: bool, device, tokens: int, heads: int, head_dim: int) -> str:
    """Which kernels run: "fast", the fast-mode kernels (asked for, on a GPU, for a head dim they support); else the
    identical ones: on a GPU "rows" (kernels/attention_rows.mojo: a warp per query or key) for a launch of fewer
    than ATTENTION_ROWS_MAX_TEAMS teams of ATTENTION_TILE queries, which would leave most multiprocessors idle,
    else "teams" (kernels/attention.mojo), which the CPU always runs (its teams' products are vectorised across
    threads: the byte LM's CPU step measured 1.28x slower by rows on a 2-core build machine). The two identical
    forms give the same bits; UFORM_ATTENTION = rows or teams forces one on either device (for tests and
    tuning)."""
    if fast and device.is_gpu and head_dim in ATTENTION_FAST_HEAD_DIMS:
        return "fast"
    forced = os.environ.get("UFORM_ATTENTION")
    if forced is not None and forced not in ("rows", "teams"):
        raise ValueError(f"UFORM_ATTENTION must be rows or teams (or unset), got {forced!r}")
    if forced:
        return forced
    small = -(-tokens // ATTENTION_TILE) * heads < ATTENTION_ROWS_MAX_TEAMS
    return "rows" if device.is_gpu and small else "teams"


def attention_forward(o: Buffer, lse: Buffer, q: Buffer, k: Buffer, v: Buffer, *, spans: Buffer, heads: int,
                      kv_heads: int, head_dim: int, causal: bool, fast: bool = False,
                      tiles: Buffer | None = None) -> None:
    """o = softmax(q·kᵀ/√D + mask)·v per head, each token seeing its span (uform.layouts.attention_spans); lse
    keeps each query's log-sum-exp for the backward. One task per tile of ATTENTION_TILE queries and head, or per
    query and head for a small launch (``_attention_form``). tiles: the tiles of layouts.attention_tiles(spans),
    uploaded right after the spans in one allocation, for the team kernels' tasks (the same bits, fewer key blocks).

    fast: on a GPU, the fast-mode kernels (bf16 tensor cores, fp32 accumulation and softmax; deterministic on one
    GPU model, see mojo/kernels/attention_fast.mojo) for head dims in ATTENTION_FAST_HEAD_DIMS; on the CPU, or
    for another head dim, the identical kernels run instead."""
    tokens = _attention_sizes(q, k, spans, heads, kv_heads, head_dim)
    _expect(v, "v", k.size)
    _expect(o, "o", q.size)
    _expect_aligned(v, o)
    _expect(lse, "lse", tokens * heads)
    tile_count = _attention_tile_count(spans, tiles, tokens)
    operands = dict(o=o, lse=lse, q=q, k=k, v=v, spans=spans,
                    **_attention_geometry(tokens, heads, kv_heads, head_dim, causal))
    form = _attention_form(fast, q.device, tokens, heads, head_dim)
    if form == "rows":
        _launch("attention_forward_rows", tokens * heads, **operands)
    elif form == "fast":
        _launch("attention_forward_fast", -(-tokens // ATTENTION_FAST_TILE) * heads, **operands)
    else:
        _launch("attention_forward", (tile_count or -(-tokens // ATTENTION_TILE)) * heads, tiles=tile_count,
                **operands)


def attention_backward(dq: Buffer, dk: Buffer, dv: Buffer, d_out: Buffer, o: Buffer, lse: Buffer, q: Buffer,
                       k: Buffer, v: Buffer, *, spans: Buffer, heads: int, kv_heads: int, head_dim: int,
                       causal: bool, delta: Buffer | None = None, d_scores: Buffer | None = None,
                       span_limit: int = 0, fast: bool = False, tiles: Buffer | None = None) -> None:
    """Gradients of attention_forward with respect to q, k and v (delta: a reusable [tokens, heads] workspace):
    δ = dO·o per (token, head), then dk and dv per tile of keys and kv head, then dq per tile of queries and head;
    by rows (``_attention_form``), one launch: a row per key and kv head (dk, dv), then per query and head (dq),
    each computing the δ it reads (delta is not used).

    d_scores (a [tokens, heads, span_limit] workspace, with span_limit ≥ 1): the dk/dv kernel keeps there the
    score gradients ds_ij of every query whose span holds at most span_limit tokens, and the dq kernel reads them
    instead of computing the scores, the probabilities and dO·v again (two of its three products) for every tile
    of such queries: the same values, so the same bits (a tile with a longer span computes them as without
    d_scores). It relies on the spans being symmetric, as layouts.attention_spans makes them (every pair a query sees is
    one the dk/dv kernel meets from the key's side). The forms by rows and fast mode do not use it.

    fast: as in attention_forward (on a GPU and a supported head dim, the bf16 kernels after the same fp32 δ;
    otherwise the identical kernels). o and lse may come from either mode's forward. tiles: as in
    attention_forward, for the dk/dv and dq team kernels."""
    tokens = _attention_sizes(q, k, spans, heads, kv_heads, head_dim)
    tile_count = _attention_tile_count(spans, tiles, tokens)
    for name, buffer, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v), ("d_out", d_out, q), ("o", o, q)):
        _expect(buffer, name, like.size)
    _expect_aligned(v, dq, dk, dv, d_out, o)
    if d_scores is not None:
        if span_limit < 1:
            raise ValueError(f"attention_backward: d_scores needs a span_limit of at least 1, got {span_limit}")
        _expect(d_scores, "d_scores", tokens * heads * span_limit)
    elif span_limit:
        raise ValueError(f"attention_backward: span_limit sizes a d_scores workspace; got {span_limit} without one")
    form = _attention_form(fast, q.device, tokens, heads, head_dim)
    # The kernels share one interface: each reads its inputs and writes its own output.
    operands = dict(o=o, lse=lse, q=q, k=k, v=v, spans=spans, d_out=d_out, dq=dq, dk=dk, dv=dv, d_scores=d_scores,
                    span_limit=span_limit, **_attention_geometry(tokens, heads, kv_heads, head_dim, causal))
    if form == "rows":
        _launch("attention_backward_rows", tokens * (kv_heads + heads), **operands)
        return
    if delta is None:
        delta = q.device.empty((tokens, heads))
    _expect(delta, "delta", tokens * heads)
    if form == "fast":
        suffix, count, tile_count = "_fast", -(-tokens // ATTENTION_FAST_TILE), 0
    else:
        suffix, count = "", tile_count or -(-tokens // ATTENTION_TILE)
    # δ's chain on 16-byte loads (fast mode's δ kernel: the same bits) wherever a GPU has it for the head dim
    vectors = q.device.is_gpu and head_dim in ATTENTION_FAST_HEAD_DIMS
    _launch("attention_backward_delta" + ("_fast" if vectors else ""), tokens * heads, delta=delta, **operands)
    _launch("attention_backward_dkdv" + suffix, count * kv_heads, delta=delta, tiles=tile_count, **operands)
    _launch("attention_backward_dq" + suffix, count * heads, delta=delta, tiles=tile_count, **operands)


# ---- rotary positions ------------------------------------------------------------------------

def rotary(x: Buffer, positions: Buffer, cos: Buffer, sin: Buffer, *, heads: int, head_dim: int,
           inverse: bool = False, axes: int = 1, fast: bool = False, y16: Buffer | None = None) -> None:
    """Rotate each head vector of x in place by its token's position (inverse: the backward). positions is
    int32 [tokens, axes]: one axis (a sequence) or three (time, row, column; see mojo/kernels/rotary.mojo).
    fast: fast mode's variant, the same bits on 16-byte vectors (x must start on 16 bytes); with y16, it writes
    the rotated x's bf16 copy there instead, leaving x as it was. A GPU runs that variant for an x that starts on
    16 bytes whatever `fast` says (its loads and stores are 2.5x fewer; the CPU's lanes are vectors already)."""
    if axes not in (1, 3):
        raise ValueError(f"rotary positions have 1 or 3 axes, got {axes}")
    if head_dim % (2 * ROTARY_PAIRS_PER_TASK):
        raise ValueError(f"rotary takes head dimensions that are multiples of {2 * ROTARY_PAIRS_PER_TASK}, as the "
                         f"engine compiles attention for {ATTENTION_HEAD_DIMS}; got {head_dim}")
    tokens = positions.size // axes
    _expect(x, "x", tokens * heads * head_dim)
    _expect(positions, "positions", tokens * axes, np.int32)
    tasks = tokens * heads * (head_dim // 2 // ROTARY_PAIRS_PER_TASK)
    operands = dict(x=x, positions=positions, cos=cos, sin=sin, heads=heads, head_dim=head_dim, axes=axes,
                    direction=-1.0 if inverse else 1.0)
    if not fast:
        if y16 is not None:
            raise ValueError("rotary: a bf16 copy (y16) is written only by the fast variant (fast=True)")
        if not (x.device.is_gpu and x.address % 16 == 0):
            _launch("rotary", tasks, **operands)
            return
    if x.address % 16 or (y16 is not None and y16.address % 8):
        raise ValueError("rotary: the fast variant moves 16-byte vectors: x must start on 16 bytes (y16 on 8)")
    if y16 is not None:
        _expect(y16, "y16", x.size, np.uint16)
    _launch("rotary_fast", tasks, y16=y16, **operands)


# ---- embedding ---------------------------------------------------------------------------------

def embedding_forward(out: Buffer, table: Buffer, ids: Buffer, width: int, *, rows: Buffer | None = None,
                      row_of: Buffer | None = None) -> None:
    """out[t] = table[ids[t]], plus rows[row_of[t]] where row_of[t] ≥ 0 (rows and row_of: both or neither)."""
    _expect(ids, "ids", ids.size, np.int32)
    _expect(out, "out", ids.size * width)
    if (rows is None) != (row_of is None):
        raise ValueError("embedding_forward takes rows and row_of together")
    if row_of is not None:
        _expect(row_of, "row_of", ids.size, np.int32)
    _launch("embedding_forward", ids.size, out=out, table=table, ids=ids, rows=rows, row_of=row_of, width=width)


def token_groups(order: Buffer, offsets: Buffer, ids: Buffer, vocab_size: int) -> None:
    """layouts.embedding_groups (without row_length) of ids already on the device, into order (n,) and offsets
    (vocab_size + 1,): the same arrays, found by a stable counting sort on the device (a warp an id, each reading
    every id twice: for the byte vocabularies, not a large one). Every id must lie in [0, vocab_size)."""
    _expect(ids, "ids", ids.size, np.int32)
    _expect(order, "order", ids.size, np.int32)
    _expect(offsets, "offsets", vocab_size + 1, np.int32)
    _launch("token_groups", vocab_size + 1, order=order, offsets=offsets, ids=ids, tokens=ids.size,
            vocabulary=vocab_size)


def embedding_backward(dtable: Buffer, d_out: Buffer, order: Buffer, offsets: Buffer, width: int, *,
                       accumulate: bool = False, partials: Buffer | None = None) -> None:
    """dtable[v] (+)= Σ of d_out over the tokens of id v, in ascending token order; with `partials` (offsets from
    ``layouts.embedding_groups`` by packed row), each row's sums into partials [rows, vocab, width], then the rows
    combined by the row tree."""
    vocab = dtable.size // width
    groups = offsets.size - 1
    _expect(order, "order", order.size, np.int32)
    _expect(d_out, "d_out", order.size * width)
    if partials is None:
        _expect(dtable, "dtable", groups * width)
        _launch("embedding_backward", groups * width, dtable=dtable, d_out=d_out, order=order, offsets=offsets,
                width=width, accumulate=accumulate)
        return
    _expect(partials, "partials", groups * width)
    _launch("embedding_backward", groups * width, dtable=partials, d_out=d_out, order=order, offsets=offsets,
            width=width)
    tree_sum(dtable, partials, groups // vocab, accumulate=accumulate)


def embedding_backward_chunked(dtable: Buffer, d_out: Buffer, order: Buffer, chunk_starts: Buffer,
                               id_chunks: Buffer, width: int, *, accumulate: bool = False) -> None:
    """Fast mode's embedding backward: dtable[v] (+)= Σ of d_out over the tokens of id v, in chunks of
    EMBEDDING_CHUNK tokens (``layouts.embedding_chunks``): each chunk ascending, then the chunks ascending
    (mojo/kernels/embedding.mojo). The device's scratch holds the chunks' sums."""
    vocab = id_chunks.size - 1
    chunks = chunk_starts.size - 1
    _expect(dtable, "dtable", vocab * width)
    _expect(order, "order", order.size, np.int32)
    _expect(d_out, "d_out", order.size * width)
    _expect(chunk_starts, "chunk_starts", chunks + 1, np.int32)
    _expect(id_chunks, "id_chunks", vocab + 1, np.int32)
    partial = dtable.device.scratch(max(chunks, 1) * width)
    _launch("embedding_chunk_sums", chunks * width, partial=partial, d_out=d_out, order=order,
            chunk_starts=chunk_starts, width=width)
    _launch("embedding_chunks_finish", vocab * width, dtable=dtable, partial=partial, id_chunks=id_chunks,
            width=width, accumulate=accumulate)


# ---- rows of the media heads --------------------------------------------------------------------

def gather_rows(out: Buffer, x: Buffer, index: Buffer, width: int) -> None:
    """out[r] = x[index[r]], or zeros where index[r] < 0."""
    _expect(index, "index", index.size, np.int32)
    _expect(out, "out", index.size * width)
    _launch("gather_rows", index.size, out=out, x=x, index=index, width=width)


def scatter_rows(out: Buffer, x: Buffer, index: Buffer, width: int, *, accumulate: bool = False) -> None:
    """out[index[r]] (+)= x[r]; the indices must be distinct and non-negative."""
    _expect(index, "index", index.size, np.int32)
    _expect(x, "x", index.size * width)
    _launch("scatter_rows", index.size, out=out, x=x, index=index, width=width, accumulate=accumulate)


def mse_rows(losses: Buffer, dpred: Buffer | None, pred: Buffer, target: Buffer, *, grad_scale: float = 1.0) -> None:
    """Per row: loss = mean over the row of (pred − target)²; dpred = (pred − target)·2·grad_scale/width."""
    rows = losses.size
    width = pred.size // max(rows, 1)
    _expect(pred, "pred", rows * width)
    _expect(target, "target", rows * width)
    if dpred is not None:
        _expect(dpred, "dpred", rows * width)
    _launch("mse_rows", rows, losses=losses, dpred=dpred, pred=pred, target=target, width=width,
            grad_scale=grad_scale)


# ---- AdamW ----------------------------------------------------------------------------------------

def adamw_step_scalars(*, step: int, lr: float, betas: tuple[float, float], weight_decay: float) -> np.ndarray:
    """The AdamW scalars that change with the step or the learning rate, [lr / c1, √c2, 1 − lr·λ]
    (c = 1 − β^step), as float32: computed in float64 and rounded once, the bits the kernel reads either way."""
    if step < 1:
        raise ValueError(f"AdamW step counts from 1, got {step}")
    beta1, beta2 = betas
    return np.array([lr / (1.0 - beta1 ** step), math.sqrt(1.0 - beta2 ** step), 1.0 - lr * weight_decay], np.float32)


def adamw(params: Buffer, grads: Buffer, m: Buffer, v: Buffer, *, step: int, lr: float,
          betas: tuple[float, float], eps: float, weight_decay: float, step_scalars: Buffer | None = None,
          verdict: Buffer | None = None) -> None:
    """One AdamW update (PyTorch's form) of `params` in place; step counts from 1. step_scalars: a buffer of three
    floats the kernel reads the step's scalars from (``adamw_step_scalars``, written before the launch runs: a
    recorded plan replays this launch every step), in place of those of `step` and `lr`. verdict: a float the
    update reads first (``step_verdict``): on 0 it changes nothing."""
    step_size, sqrt_c2, decay = adamw_step_scalars(step=step, lr=lr, betas=betas, weight_decay=weight_decay)
    for name, buffer in (("grads", grads), ("m", m), ("v", v)):
        _expect(buffer, name, params.size)
    if step_scalars is not None:
        _expect(step_scalars, "step_scalars", 3)
    if verdict is not None:
        _expect(verdict, "verdict", 1)
    beta1, beta2 = betas
    _launch("adamw", params.size, params=params, grads=grads, m=m, v=v, step_scalars=step_scalars, verdict=verdict,
            beta1=beta1, beta2=beta2, one_minus_beta1=1.0 - beta1, one_minus_beta2=1.0 - beta2, decay=float(decay),
            step_size=float(step_size), sqrt_c2=float(sqrt_c2), eps=eps)


def step_verdict(verdict: Buffer, losses: Buffer, sums: Buffer) -> None:
    """verdict = 1 if every loss is finite and every sum is finite with |sum| ≤ LARGEST_SQUARABLE, else 0: whether a
    step's update may run, decided on the device (mojo/kernels/verdict.mojo)."""
    _expect(verdict, "verdict", 1)
    _launch("step_verdict", 1, verdict=verdict, losses=losses, sums=sums, loss_count=losses.size,
            sum_count=sums.size)


# ---- the contrastive head --------------------------------------------------------------------------


def pool_forward(e: Buffer, y: Buffer, starts: Buffer, lengths: Buffer, width: int) -> None:
    """e[s] = mean of y over the tokens [starts[s], starts[s] + lengths[s])."""
    segments = starts.size
    _expect(e, "e", segments * width)
    _expect(starts, "starts", segments, np.int32)
    _expect(lengths, "lengths", segments, np.int32)
    _launch("pool_forward", segments * width, e=e, y=y, starts=starts, lengths=lengths, width=width)


def pool_backward(dy: Buffer, de: Buffer, token_segments: Buffer, lengths: Buffer, width: int, *,
                  accumulate: bool = False) -> None:
    """dy[t] (+)= de[segment of t] / its length (tokens of segment −1 get nothing)."""
    tokens = token_segments.size
    _expect(dy, "dy", tokens * width)
    _expect(token_segments, "token_segments", tokens, np.int32)
    _launch("pool_backward", tokens * width, dy=dy, de=de, token_segments=token_segments, lengths=lengths, width=width,
            accumulate=accumulate)


def l2_normalize_forward(u: Buffer, inverse_norm: Buffer, e: Buffer, width: int, stride: int) -> None:
    """u = e[:, :width] / √(Σ e[:, :width]² + 1e-12) over rows of `stride` columns."""
    rows = inverse_norm.size
    _expect(u, "u", rows * width)
    _expect(e, "e", rows * stride)
    _launch("l2_normalize_forward", rows, u=u, inverse_norm=inverse_norm, e=e, width=width, stride=stride)


def l2_normalize_backward(de: Buffer, du: Buffer, u: Buffer, inverse_norm: Buffer, width: int, stride: int, *,
                          accumulate: bool = False) -> None:
    rows = inverse_norm.size
    _expect(du, "du", rows * width)
    _expect(de, "de", rows * stride)
    _launch("l2_normalize_backward", rows, de=de, du=du, u=u, inverse_norm=inverse_norm, width=width, stride=stride,
            accumulate=accumulate)


def row_temperature(out: Buffer, log_scale: Buffer, bias: Buffer, groups: Buffer) -> None:
    """out[i] = (e^log_scale[g_i], bias[g_i]) for every anchor row."""
    rows = groups.size
    _expect(out, "out", rows * 2)
    _expect(groups, "groups", rows, np.int32)
    _launch("row_temperature", rows, out=out, log_scale=log_scale, bias=bias, groups=groups)


def pair_loss(losses: Buffer, dcos: Buffer, dlog_scale_rows: Buffer, dbias_rows: Buffer, cos: Buffer,
              sign: Buffer, weight: Buffer, temperature_rows: Buffer, *, form: int, ranked_norm: float = 1.0,
              grad_scale: float = 1.0) -> None:
    """Per anchor row: the pair loss of z = t·cos + b against (sign, weight), dcos and the row's
    temperature gradients (see mojo/kernels/contrastive.mojo)."""
    rows = losses.size
    for name, buffer in (("dcos", dcos), ("cos", cos), ("sign", sign), ("weight", weight)):
        _expect(buffer, name, rows * rows)
    _launch("pair_loss", rows, losses=losses, dcos=dcos, dlog_scale_rows=dlog_scale_rows, dbias_rows=dbias_rows,
            cos=cos, sign=sign, weight=weight, temperature_rows=temperature_rows, rows=rows, form=form,
            ranked_norm=ranked_norm, grad_scale=grad_scale)


def group_sums(out: Buffer, values: Buffer, groups: Buffer, *, accumulate: bool = False) -> None:
    """out[g] (+)= Σ of values over the rows of group g, ascending."""
    _expect(groups, "groups", values.size, np.int32)
    _launch("group_sums", out.size, out=out, values=values, groups=groups, rows=values.size, accumulate=accumulate)


# ---- late interaction and choices (mojo/kernels/late_interaction.mojo, choices.mojo) -----------------------

def maxsim_forward(best: Buffer, arg: Buffer, queries: Buffer, documents: Buffer, document_starts: Buffer,
                   document_counts: Buffer, width: int) -> None:
    """best[a, j] = max over document j's rows b of queries[a]·documents[b], arg[a, j] the lowest such b
    (−1 where j has no rows)."""
    segments = document_counts.size
    query_rows = queries.size // width
    _expect(best, "best", query_rows * segments)
    _expect(arg, "arg", query_rows * segments, np.int32)
    _expect(document_starts, "document_starts", segments, np.int32)
    _expect(document_counts, "document_counts", segments, np.int32)
    _launch("maxsim_forward", query_rows * segments, best=best, arg=arg, queries=queries, documents=documents,
            document_starts=document_starts, document_counts=document_counts, segments=segments, width=width)


def maxsim_scores(scores: Buffer, best: Buffer, query_starts: Buffer, query_counts: Buffer,
                  document_counts: Buffer) -> None:
    """scores[i, j] = Σ over query i's rows a of best[a, j] (0 unless i has query rows and j document rows)."""
    segments = query_counts.size
    _expect(scores, "scores", segments * segments)
    _launch("maxsim_scores", segments * segments, scores=scores, best=best, query_starts=query_starts,
            query_counts=query_counts, document_counts=document_counts, segments=segments)


def maxsim_backward(d_queries: Buffer, d_documents: Buffer, d_scores: Buffer, arg: Buffer, queries: Buffer,
                    documents: Buffer, query_segment: Buffer, document_segment: Buffer, segments: int,
                    width: int) -> None:
    """The gradients at the query and document rows: each maximum's gradient goes to the row that attained
    it."""
    query_rows, document_rows = query_segment.size, document_segment.size
    _expect(d_scores, "d_scores", segments * segments)
    _expect(arg, "arg", query_rows * segments, np.int32)
    _expect(d_queries, "d_queries", query_rows * width)
    _expect(d_documents, "d_documents", document_rows * width)
    _launch("maxsim_backward_queries", query_rows, d_queries=d_queries, d_scores=d_scores, arg=arg,
            documents=documents, query_segment=query_segment, segments=segments, width=width)
    _launch("maxsim_backward_documents", document_rows, d_documents=d_documents, d_scores=d_scores, arg=arg,
            queries=queries, query_segment=query_segment, document_segment=document_segment, segments=segments,
            width=width, query_rows=query_rows)


def choice_loss(probabilities: Buffer, losses: Buffer | None, d_logits: Buffer | None, logits: Buffer,
                offsets: Buffer, choice_bytes: Buffer, targets: Buffer | None, *, grad_scale: float = 1.0) -> None:
    """Per item: the softmax of its logits row over its legal bytes (into probabilities); with targets, the
    soft-target cross-entropy (losses) and, given d_logits, its gradient times grad_scale."""
    items = offsets.size - 1
    vocab = logits.size // max(items, 1)
    _expect(offsets, "offsets", items + 1, np.int32)
    _expect(choice_bytes, "choice_bytes", probabilities.size, np.int32)
    if targets is not None:
        _expect(targets, "targets", probabilities.size)
    _launch("choice_loss", items, probabilities=probabilities, losses=losses, d_logits=d_logits, logits=logits,
            offsets=offsets, choice_bytes=choice_bytes, targets=targets, vocab=vocab, grad_scale=grad_scale)
