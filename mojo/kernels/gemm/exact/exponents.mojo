"""The residue form's first pass: each operand line's exponent e (its largest magnitude in [2^(e−1), 2^e)).

`line_exponents` takes a line a GPU warp (a CPU task) where the line is contiguous; a transposed operand's lines
run across memory, so `partial_maxima` first finds each block of EXPONENT_BLOCK k's largest magnitudes with
neighbouring lines' reads side by side, and the exponents come from those maxima (exponents_of_maxima). A line
holding an infinity or a NaN records NON_FINITE. The launchers below run them for one operand, or for the
terms of a product joined along k (joined_line_exponents).
"""

from std.memory import bitcast
from std.collections import Array
from engine.device import F32Ptr, I32Ptr, f32_at, i32_at
from engine.launch import Args, DevicePtr, launch_index, launch_rows
from engine.reduction import row_stride
from max.gpu.primitives.warp import shuffle_down
from kernels.gemm.exact.definition import exponent_of_largest
from kernels.gemm.exact.residues import Joined


comptime EXPONENT_READS = 8  # loads largest_magnitude keeps in flight a thread


@always_inline
def largest_magnitude(x: F32Ptr, begin: Int, end: Int, stride: Int, step: Int) -> UInt32:
    """The bits of the largest magnitude among elements begin, begin + stride, … below `end` of a line (element i
    at x[i·step]). The reads go EXPONENT_READS at a time into as many maxima, so that a GPU thread has that many
    loads in flight; a maximum of bit patterns, so any order gives the same bits."""
    var maxima = SIMD[DType.uint32, EXPONENT_READS](0)
    var i = begin
    while i + (EXPONENT_READS - 1) * stride < end:
        comptime for j in range(EXPONENT_READS):
            maxima[j] = max(maxima[j], bitcast[DType.uint32](x.unsafe_load((i + j * stride) * step)) & 0x7FFFFFFF)
        i += EXPONENT_READS * stride
    for rest in range(i, end, stride):
        maxima[0] = max(maxima[0], bitcast[DType.uint32](x.unsafe_load(rest * step)) & 0x7FFFFFFF)
    return maxima.reduce_max()


@fieldwise_init
struct LineExponents(ImplicitlyCopyable, Movable):
    """line_exponents' operands: the exponents (int32 a line) of lines of x, laid out as LimbPrep's; with
    `magnitudes`, the bits of each line's largest magnitude instead."""

    var exponents: I32Ptr
    var x: F32Ptr
    var length: Int
    var line_stride: Int
    var element_stride: Int
    var magnitudes: Bool

    @always_inline
    def __init__(out self, args: Args):
        self.exponents = args.i32(0)
        self.x = args.f32(1)
        self.length = args.size(0)
        self.line_stride = args.size(1)
        self.element_stride = args.size(2)
        self.magnitudes = args.flag(3)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.exponents))
        args.addresses[1] = Int64(Int(self.x))
        args.sizes[0] = Int64(self.length)
        args.sizes[1] = Int64(self.line_stride)
        args.sizes[2] = Int64(self.element_stride)
        args.sizes[3] = Int64(1 if self.magnitudes else 0)
        return args


def line_exponents[warp: Bool](line: Int, lane: Int, args: Args):
    """exponents[line] = e of line `line` of x (LineExponents), as line_exponent finds it: taken by one caller, or
    by a GPU warp whose thread `lane` reads elements lane, lane + 32, … and whose lanes then meet by shuffles (a
    maximum of bit patterns, so any order gives the same e). With `magnitudes`, the bits of the line's largest
    magnitude instead (joined_line_exponents)."""
    var lines = LineExponents(args)
    var x = lines.x.unsafe_offset(line * lines.line_stride)
    var largest = largest_magnitude(x, lane, lines.length, row_stride[warp](), lines.element_stride)
    comptime if warp:
        comptime for level in range(5):
            largest = max(largest, shuffle_down(largest, UInt32(16 >> level)))
    if lane == 0:
        lines.exponents.unsafe_store(line, Int32(largest) if lines.magnitudes else exponent_of_largest(largest))


comptime EXPONENT_BLOCK = 64  # k one partial_maxima task reads
@fieldwise_init
struct PartialMaxima(ImplicitlyCopyable, Movable):
    """partial_maxima's operands: the bits of the largest magnitudes (int32) of blocks of EXPONENT_BLOCK k of `lines`
    lines of x, laid out as LimbPrep's; with k cut into `ranges` equal ranges of per_range blocks, in ranges. A
    block's maxima of the lines lie `apart` apart: `lines`, or more where these lines are some of an operand's
    joined along its lines (ranges_fused), whose place the caller's `partial` gives."""

    var partial: I32Ptr
    var x: F32Ptr
    var length: Int
    var line_stride: Int
    var element_stride: Int
    var lines: Int
    var ranges: Int
    var per_range: Int
    var apart: Int

    @always_inline
    def __init__(out self, args: Args):
        self.partial = args.i32(0)
        self.x = args.f32(1)
        self.length = args.size(0)
        self.line_stride = args.size(1)
        self.element_stride = args.size(2)
        self.lines = args.size(3)
        self.ranges = args.size(4)
        self.per_range = args.size(5)
        self.apart = args.size(6)

    def args(self) -> Args:
        var args = Args.empty()
        args.addresses[0] = Int64(Int(self.partial))
        args.addresses[1] = Int64(Int(self.x))
        args.sizes[0] = Int64(self.length)
        args.sizes[1] = Int64(self.line_stride)
        args.sizes[2] = Int64(self.element_stride)
        args.sizes[3] = Int64(self.lines)
        args.sizes[4] = Int64(self.ranges)
        args.sizes[5] = Int64(self.per_range)
        args.sizes[6] = Int64(self.apart)
        return args


def partial_maxima(task: Int, args: Args):
    """For lines whose elements lie `lines` apart (a transposed operand, neighbouring lines side by side): task
    b·lines + line finds the largest magnitude's bits among elements [64b, 64(b + 1)) of line `line`
    (EXPONENT_BLOCK), so neighbouring tasks read neighbouring floats and a long line spreads over many tasks. It
    stores them at partial[b·apart + line]; or, with k cut into equal ranges of per_range blocks, block j of range
    r at partial[(j·ranges + r)·apart + line], so that range r's maxima of a line lie ranges·apart apart from
    r·apart + line on (exponents_of_maxima's layout: a range of a line is a line of maxima)."""
    var maxima = PartialMaxima(args)
    var lines = maxima.lines
    var per_range = maxima.per_range
    var line = task % lines
    var b = task // lines
    var first = b * EXPONENT_BLOCK
    var x = maxima.x.unsafe_offset(line * maxima.line_stride)
    var index = b * maxima.apart + line
    if per_range > 0:
        index = (b % per_range * maxima.ranges + b // per_range) * maxima.apart + line
    var end = min(maxima.length, first + EXPONENT_BLOCK)
    maxima.partial.unsafe_store(index, Int32(largest_magnitude(x, first, end, 1, maxima.element_stride)))


def exponent_blocks(K: Int) -> Int:
    """How many partial maxima a transposed line of K values takes."""
    return (K + EXPONENT_BLOCK - 1) // EXPONENT_BLOCK


def exponents_bytes(count: Int) -> Int:
    """Bytes of `count` int32 exponents in a workspace, rounded up to 16 so that planes after them stay aligned for
    their 16-byte stores and copies."""
    return (4 * count + 15) // 16 * 16


def joined_line_exponents[terms: Int](
    dev: DevicePtr, exponents: Int, partial: Int, x: Array[F32Ptr, terms], lines: Int, k: Joined[terms], along: Bool
) raises:
    """exponents[line] = e of each line over every term, laid out as joined_planes takes them: the bits of each
    term's largest magnitudes of each line side by side in `partial` (a warp a line where its elements are
    contiguous, else partial_maxima over blocks of k), `lines` apart, then line_exponents over them, as over a
    transposed line's partial maxima (a maximum of bit patterns: any order and grouping give the same e)."""
    var blocks = 0  # the partial maxima of each line so far
    for t in range(k.count):
        var at = partial + 4 * blocks * lines
        if along:
            contiguous_line_exponents(dev, at, x[t], lines, k.k[t], k.k[t], True)
            blocks += 1
        else:
            blocks += partial_maxima_on(dev, at, x[t], lines, k.k[t], 1, lines)
    exponents_of_maxima(dev, exponents, partial, lines, blocks, lines)


def line_exponents_on(
    dev: DevicePtr, exponents: Int, partial: Int, x: F32Ptr, lines: Int, length: Int, line_stride: Int,
    element_stride: Int,
) raises:
    """exponents[line] = e of each line. Where a line's elements are contiguous, a GPU warp takes a line
    (line_exponents); else the lines' partial maxima over blocks of EXPONENT_BLOCK k (partial_maxima, into
    `partial`: exponent_blocks(length)·lines values; a partial maximum's bits are a magnitude's, so line_exponents
    over them finds the line's e). k cut into ranges: ranged_planes."""
    if element_stride == 1:
        contiguous_line_exponents(dev, exponents, x, lines, length, line_stride, False)
    else:
        var blocks = partial_maxima_on(dev, partial, x, lines, length, line_stride, element_stride)
        exponents_of_maxima(dev, exponents, partial, lines, blocks, lines)


def contiguous_line_exponents(
    dev: DevicePtr, exponents: Int, x: F32Ptr, lines: Int, length: Int, line_stride: Int, magnitudes: Bool
) raises:
    """line_exponents over lines whose elements are contiguous, a GPU warp a line: exponents[line] = each line's e,
    or with `magnitudes` the bits of its largest magnitude."""
    var exponents_of_lines = LineExponents(i32_at(exponents), x, length, line_stride, 1, magnitudes)
    launch_rows[line_exponents](dev, lines, exponents_of_lines.args())


def exponents_of_maxima(dev: DevicePtr, exponents: Int, partial: Int, lines: Int, per_line: Int, apart: Int) raises:
    """exponents[line] = e of each line from its `per_line` largest magnitudes' bits in `partial`, those of line l at
    partial[l + j·apart] (line_exponents over them: a maximum of bit patterns)."""
    var maxima = LineExponents(i32_at(exponents), f32_at(partial), per_line, 1, apart, False)
    launch_rows[line_exponents](dev, lines, maxima.args())


def partial_maxima_on(
    dev: DevicePtr, partial: Int, x: F32Ptr, lines: Int, length: Int, line_stride: Int, element_stride: Int,
    per_range: Int = 0, apart: Int = 0,
) raises -> Int:
    """partial[b·apart + line] = the bits of line `line`'s largest magnitude over k [64b, 64(b + 1)) (EXPONENT_BLOCK),
    or with per_range > 0 in partial_maxima's layout of k ranges; apart: `lines` (0), or more for lines joined with
    others' (PartialMaxima). Answers the number of blocks."""
    var blocks = exponent_blocks(length)
    var ranges = blocks // per_range if per_range > 0 else 0
    var maxima = PartialMaxima(i32_at(partial), x, length, line_stride, element_stride, lines, ranges, per_range,
                               apart if apart > 0 else lines)
    launch_index[partial_maxima](dev, blocks * lines, maxima.args())
    return blocks
