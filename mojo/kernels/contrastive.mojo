"""The contrastive head: segment pooling, L2 normalisation of Matryoshka prefixes, pair losses.

Pooling, one body per (segment, column) (forward) or per (token, column) (backward), so that neighbouring
GPU threads read neighbouring columns:
    e_s = Σ_{t ∈ s, ascending} y_t / |s|           dy_t (+)= de_{s(t)} / |s(t)|
L2 normalisation of the first d of `stride` columns, one body per row:
    r = 1/√(Σ e² + 1e-12)   u = e·r                de (+)= r·(du − u·(u·du))
Scores and pair losses, one body per anchor row i, with t_i = e^{log_scale[g_i]}, b_i = bias[g_i]:
    z_ij = t_i·cos_ij + b_i
    weighted sigmoid (SIGMOID, BALANCED; the host folds each form's normalisation into w):
        loss_i = Σ_j w_ij·softplus(−s_ij·z_ij)              dz_ij = −s_ij·w_ij·σ(−s_ij·z_ij)
    ranked (every positive p over every negative n of the row, normalised by ranked_norm):
        loss_i = ρ·Σ_p Σ_n w_ip·w_in·softplus(z_in − z_ip)  dz_in += ρ·w·w·σ(z_in − z_ip), dz_ip −= the same
    dcos_ij = γ·dz_ij·t_i    dlog_scale_i = γ·Σ_j dz_ij·cos_ij·t_i    dbias_i = γ·Σ_j dz_ij
(ρ = ranked_norm, γ = grad_scale)
Every Σ ascends its index; per-group sums of the row terms ascend the rows.
"""

from engine.launch import Args, Interface
from engine.reduction import canonical_reduce
from engine import numerics

comptime NORM_EPSILON = Float32(1e-12)
# The pair-loss forms (exported to Python): SIGMOID and BALANCED share one, the host folding
# each one's normalisation into the weights.
comptime FORM_WEIGHTED_SIGMOID = 0
comptime FORM_RANKED = 1


comptime POOL_FORWARD = Interface("e y starts lengths", "width", "")


def pool_forward(task: Int, args: Args):
    """e [S, H]; y [N, H]; each segment's first token and length, int32 [S]. Task s·H + c: column c of segment s."""
    var H = args.size(0)
    var s = task // H
    var c = task % H
    var y = args.f32(1)
    var start = Int(args.i32(2).unsafe_load(s))
    var count = Int(args.i32(3).unsafe_load(s))
    var total = Float32(0)
    for t in range(start, start + count):
        total += y.unsafe_load(t * H + c)
    args.f32(0).unsafe_store(task, total / Float32(count))


comptime POOL_BACKWARD = Interface("dy de token_segments lengths", "width accumulate", "")


def pool_backward(task: Int, args: Args):
    """dy [N, H]; de [S, H]; each token's segment int32 [N] (−1: none); segment lengths int32 [S].
    Task t·H + c: column c of token t."""
    var H = args.size(0)
    var accumulate = args.flag(1)
    var t = task // H
    var c = task % H
    var dy = args.f32(0)
    var s = Int(args.i32(2).unsafe_load(t))
    var g = Float32(0)
    if s >= 0:
        g = args.f32(1).unsafe_load(s * H + c) / Float32(Int(args.i32(3).unsafe_load(s)))
    if accumulate:
        g = dy.unsafe_load(task) + g
    dy.unsafe_store(task, g)


comptime L2_NORMALIZE_FORWARD = Interface("u inverse_norm e", "width stride", "")


def l2_normalize_forward(s: Int, args: Args):
    """u [S, d] from the first d of each row of e [S, stride]; the inverse norm [S] kept for the backward."""
    var d = args.size(0)
    var stride = args.size(1)
    var u = args.f32(0).unsafe_offset(s * d)
    var inverse_norm = args.f32(1)
    var e = args.f32(2).unsafe_offset(s * stride)

    def square(c: Int) {imm e} -> Float32:
        var x = e.unsafe_load(c)
        return x * x

    var r = numerics.rsqrt(canonical_reduce(square, d) + NORM_EPSILON)
    inverse_norm.unsafe_store(s, r)
    for c in range(d):
        u.unsafe_store(c, e.unsafe_load(c) * r)


comptime L2_NORMALIZE_BACKWARD = Interface("de du u inverse_norm", "width stride accumulate", "")


def l2_normalize_backward(s: Int, args: Args):
    var d = args.size(0)
    var stride = args.size(1)
    var accumulate = args.flag(2)
    var de = args.f32(0).unsafe_offset(s * stride)
    var du = args.f32(1).unsafe_offset(s * d)
    var u = args.f32(2).unsafe_offset(s * d)
    var r = args.f32(3).unsafe_load(s)

    def product(c: Int) {imm u, imm du} -> Float32:
        return u.unsafe_load(c) * du.unsafe_load(c)

    var projection = canonical_reduce(product, d)
    for c in range(d):
        var g = r * (du.unsafe_load(c) - u.unsafe_load(c) * projection)
        if accumulate:
            g = de.unsafe_load(c) + g
        de.unsafe_store(c, g)


comptime ROW_TEMPERATURE = Interface("out log_scale bias groups", "", "")


def row_temperature(i: Int, args: Args):
    """out [S, 2] = (t_i, b_i) of each row's group (int32 [S])."""
    var out = args.f32(0).unsafe_offset(2 * i)
    var log_scale = args.f32(1)
    var bias = args.f32(2)
    var g = Int(args.i32(3).unsafe_load(i))
    out.unsafe_store(0, numerics.exp(log_scale.unsafe_load(g)))
    out.unsafe_store(1, bias.unsafe_load(g))


comptime PAIR_LOSS = Interface(
    "losses dcos dlog_scale_rows dbias_rows cos sign weight temperature_rows", "rows form", "ranked_norm grad_scale"
)


def pair_loss(i: Int, args: Args):
    """Row i of the [S, S] matrices cos, sign and weight; temperature_rows [S, 2] = (t, b) per row."""
    var S = args.size(0)
    var form = args.size(1)
    var ranked_norm = args.scalar(0)
    var grad_scale = args.scalar(1)
    var losses = args.f32(0)
    var dz = args.f32(1).unsafe_offset(i * S)  # holds dz while the row is summed, dcos at the end
    var dlog_scale_rows = args.f32(2)
    var dbias_rows = args.f32(3)
    var cos = args.f32(4).unsafe_offset(i * S)
    var sign = args.f32(5).unsafe_offset(i * S)
    var weight = args.f32(6).unsafe_offset(i * S)
    var t = args.f32(7).unsafe_load(2 * i)
    var b = args.f32(7).unsafe_load(2 * i + 1)
    for j in range(S):
        dz.unsafe_store(j, Float32(0))
    var loss = Float32(0)
    if form == FORM_WEIGHTED_SIGMOID:
        for j in range(S):
            var s = sign.unsafe_load(j)
            if s != Float32(0):
                var w = weight.unsafe_load(j)
                var z = t * cos.unsafe_load(j) + b
                loss += w * numerics.softplus(-s * z)
                dz.unsafe_store(j, -s * w * numerics.sigmoid(-s * z))
    else:
        for p in range(S):
            if sign.unsafe_load(p) > Float32(0):
                var z_p = t * cos.unsafe_load(p) + b
                for n in range(S):
                    if sign.unsafe_load(n) < Float32(0):
                        var w = ranked_norm * (weight.unsafe_load(p) * weight.unsafe_load(n))
                        var gap = (t * cos.unsafe_load(n) + b) - z_p
                        loss += w * numerics.softplus(gap)
                        var force = w * numerics.sigmoid(gap)
                        dz.unsafe_store(n, dz.unsafe_load(n) + force)
                        dz.unsafe_store(p, dz.unsafe_load(p) - force)
    var dlog_scale = Float32(0)
    var dbias = Float32(0)
    for j in range(S):
        var g = grad_scale * dz.unsafe_load(j)
        dlog_scale += g * (cos.unsafe_load(j) * t)
        dbias += g
        dz.unsafe_store(j, g * t)
    losses.unsafe_store(i, loss)
    dlog_scale_rows.unsafe_store(i, dlog_scale)
    dbias_rows.unsafe_store(i, dbias)


comptime GROUP_SUMS = Interface("out values groups", "rows accumulate", "")


def group_sums(g: Int, args: Args):
    """out [G] (+)= Σ of values [S] over the rows whose group (int32 [S]) is g, ascending."""
    var out = args.f32(0)
    var values = args.f32(1)
    var groups = args.i32(2)
    var S = args.size(0)
    var accumulate = args.flag(1)
    var total = Float32(0)
    for i in range(S):
        if Int(groups.unsafe_load(i)) == g:
            total += values.unsafe_load(i)
    if accumulate:
        total = out.unsafe_load(g) + total
    out.unsafe_store(g, total)
