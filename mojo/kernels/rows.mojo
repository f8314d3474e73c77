"""Row moves and the reconstruction loss of the media heads, one body per row.

    gather_rows:    out[r] = x[index[r]]            (index[r] < 0: a row of zeros)
    scatter_rows:   out[index[r]] (+)= x[r]          (the indices distinct, so no two tasks meet)
    mse_rows:       loss[r] = Σ_d (p_rd − t_rd)² / W        dp_rd = (p_rd − t_rd) · 2γ/W

The media tokens of a packed batch are scattered among its text tokens: the patch embedding and the
reconstruction heads run on dense rows of patches, and these kernels move rows between the dense
and the packed layouts. The Σ of mse_rows is `canonical_reduce`.
"""

from engine.launch import Args, Interface
from engine.reduction import canonical_reduce

comptime GATHER_ROWS = Interface("out x index", "width", "")


def gather_rows(r: Int, args: Args):
    var W = args.size(0)
    var out = args.f32(0).unsafe_offset(r * W)
    var x = args.f32(1)
    var source = Int(args.i32(2).unsafe_load(r))
    for c in range(W):
        out.unsafe_store(c, x.unsafe_load(source * W + c) if source >= 0 else Float32(0))


comptime SCATTER_ROWS = Interface("out x index", "width accumulate", "")


def scatter_rows(r: Int, args: Args):
    var W = args.size(0)
    var accumulate = args.flag(1)
    var out = args.f32(0).unsafe_offset(Int(args.i32(2).unsafe_load(r)) * W)
    var x = args.f32(1).unsafe_offset(r * W)
    for c in range(W):
        var value = x.unsafe_load(c)
        if accumulate:
            value = out.unsafe_load(c) + value
        out.unsafe_store(c, value)


comptime MSE_ROWS = Interface("losses dpred pred target", "width", "grad_scale")


def mse_rows(r: Int, args: Args):
    """dpred is optional: without it only the losses are written."""
    var W = args.size(0)
    var grad_scale = args.scalar(0)
    var losses = args.f32(0)
    var pred = args.f32(2).unsafe_offset(r * W)
    var target = args.f32(3).unsafe_offset(r * W)

    def squared_error(c: Int) {imm pred, imm target} -> Float32:
        var e = pred.unsafe_load(c) - target.unsafe_load(c)
        return e * e

    losses.unsafe_store(r, canonical_reduce(squared_error, W) / Float32(W))
    if args.given(1):
        var dpred = args.f32(1).unsafe_offset(r * W)
        var factor = (Float32(2) * grad_scale) / Float32(W)
        for c in range(W):
            dpred.unsafe_store(c, (pred.unsafe_load(c) - target.unsafe_load(c)) * factor)
