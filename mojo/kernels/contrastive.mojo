"""The contrastive head: segment pooling, L2 normalisation of Matryoshka prefixes, pair losses.

Pooling, one body per segment (forward) or per token (backward):
    e_s = Σ_{t ∈ s, ascending} y_t / |s|           dy_t (+)= de_{s(t)} / |s(t)|
L2 normalisation of the first d of `stride` columns, one body per row:
    r = 1/√(Σ e² + 1e-12)   u = e·r                de (+)= r·(du − u·(u·du))
Scores and pair losses, one body per anchor row i, with t_i = e^{log_scale[g_i]}, b_i = bias[g_i]:
    z_ij = t_i·cos_ij + b_i
    weighted sigmoid (SIGMOID, BALANCED; the host folds each form's normalisation into w):
        loss_i = Σ_j w_ij·softplus(−s_ij·z_ij)              dz_ij = −s_ij·w_ij·σ(−s_ij·z_ij)
    ranked (every positive p over every negative n of the row, normalised by x0):
        loss_i = x0·Σ_p Σ_n w_ip·w_in·softplus(z_in − z_ip)  dz_in += x0·w·w·σ(z_in − z_ip), dz_ip −= the same
    dcos_ij = x1·dz_ij·t_i    dlog_scale_i = x1·Σ_j dz_ij·cos_ij·t_i    dbias_i = x1·Σ_j dz_ij
Every Σ ascends its index; per-group sums of the row terms ascend the rows.
"""

from engine.device import f32_at, i32_at
from engine.launch import Args
from engine.reduction import canonical_reduce
from engine import numerics

comptime NORM_EPSILON = Float32(1e-12)
comptime FORM_WEIGHTED_SIGMOID = 0
comptime FORM_RANKED = 1


def pool_forward(s: Int, args: Args):
    """a0 = e [S,H], a1 = y [N,H], a2 = segment start token int32 [S], a3 = segment length int32 [S]; n0 = H."""
    var H = args.n0
    var start = Int(i32_at(args.a2).unsafe_load(s))
    var count = Int(i32_at(args.a3).unsafe_load(s))
    var e = f32_at(args.a0 + s * H * 4)
    for c in range(H):
        var total = Float32(0)
        for t in range(start, start + count):
            total += f32_at(args.a1 + t * H * 4).unsafe_load(c)
        e.unsafe_store(c, total / Float32(count))


def pool_backward(t: Int, args: Args):
    """a0 = dy [N,H], a1 = de [S,H], a2 = segment of token int32 [N] (−1: none), a3 = segment length; n0 = H, n1 = accumulate."""
    var H = args.n0
    var s = Int(i32_at(args.a2).unsafe_load(t))
    var dy = f32_at(args.a0 + t * H * 4)
    for c in range(H):
        var g = Float32(0)
        if s >= 0:
            g = f32_at(args.a1 + s * H * 4).unsafe_load(c) / Float32(Int(i32_at(args.a3).unsafe_load(s)))
        if args.n1 != 0:
            g = dy.unsafe_load(c) + g
        dy.unsafe_store(c, g)


def l2_normalize_forward(s: Int, args: Args):
    """a0 = u [S,d], a1 = inverse norm [S], a2 = e [S,stride]; n0 = d, n1 = stride."""
    var d = args.n0
    var e = f32_at(args.a2 + s * args.n1 * 4)
    var u = f32_at(args.a0 + s * d * 4)

    def square(c: Int) {imm e} -> Float32:
        var x = e.unsafe_load(c)
        return x * x

    var r = numerics.rsqrt(canonical_reduce(square, d) + NORM_EPSILON)
    f32_at(args.a1).unsafe_store(s, r)
    for c in range(d):
        u.unsafe_store(c, e.unsafe_load(c) * r)


def l2_normalize_backward(s: Int, args: Args):
    """a0 = de [S,stride], a1 = du [S,d], a2 = u [S,d], a3 = inverse norm [S]; n0 = d, n1 = stride, n2 = accumulate."""
    var d = args.n0
    var de = f32_at(args.a0 + s * args.n1 * 4)
    var du = f32_at(args.a1 + s * d * 4)
    var u = f32_at(args.a2 + s * d * 4)
    var r = f32_at(args.a3).unsafe_load(s)

    def product(c: Int) {imm u, imm du} -> Float32:
        return u.unsafe_load(c) * du.unsafe_load(c)

    var projection = canonical_reduce(product, d)
    for c in range(d):
        var g = r * (du.unsafe_load(c) - u.unsafe_load(c) * projection)
        if args.n2 != 0:
            g = de.unsafe_load(c) + g
        de.unsafe_store(c, g)


def row_temperature(i: Int, args: Args):
    """a0 = (t_i, b_i) [S,2], a1 = log_scale [G], a2 = bias [G], a3 = group of row int32 [S]."""
    var g = Int(i32_at(args.a3).unsafe_load(i))
    var out = f32_at(args.a0 + i * 8)
    out.unsafe_store(0, numerics.exp(f32_at(args.a1).unsafe_load(g)))
    out.unsafe_store(1, f32_at(args.a2).unsafe_load(g))


def pair_loss(i: Int, args: Args):
    """a0 = loss [S], a1 = dcos [S,S], a2 = dlog_scale per row [S], a3 = dbias per row [S], a4 = cos [S,S],
    a5 = sign [S,S], a6 = weight [S,S], a7 = (t, b) per row [S,2]; n0 = S, n1 = form; x0 = ranked norm, x1 = scale."""
    var S = args.n0
    var cos = f32_at(args.a4 + i * S * 4)
    var sign = f32_at(args.a5 + i * S * 4)
    var weight = f32_at(args.a6 + i * S * 4)
    var dz = f32_at(args.a1 + i * S * 4)  # holds dz while the row is summed, dcos at the end
    var t = f32_at(args.a7 + i * 8).unsafe_load(0)
    var b = f32_at(args.a7 + i * 8).unsafe_load(1)
    for j in range(S):
        dz.unsafe_store(j, Float32(0))
    var loss = Float32(0)
    if args.n1 == FORM_WEIGHTED_SIGMOID:
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
                        var w = args.x0 * (weight.unsafe_load(p) * weight.unsafe_load(n))
                        var gap = (t * cos.unsafe_load(n) + b) - z_p
                        loss += w * numerics.softplus(gap)
                        var force = w * numerics.sigmoid(gap)
                        dz.unsafe_store(n, dz.unsafe_load(n) + force)
                        dz.unsafe_store(p, dz.unsafe_load(p) - force)
    var dlog_scale = Float32(0)
    var dbias = Float32(0)
    for j in range(S):
        var g = args.x1 * dz.unsafe_load(j)
        dlog_scale += g * (cos.unsafe_load(j) * t)
        dbias += g
        dz.unsafe_store(j, g * t)
    f32_at(args.a0).unsafe_store(i, loss)
    f32_at(args.a2).unsafe_store(i, dlog_scale)
    f32_at(args.a3).unsafe_store(i, dbias)


def group_sums(g: Int, args: Args):
    """a0 = out [G], a1 = values [S], a2 = group of row int32 [S]; n0 = S, n1 = accumulate."""
    var total = Float32(0)
    for i in range(args.n0):
        if Int(i32_at(args.a2).unsafe_load(i)) == g:
            total += f32_at(args.a1).unsafe_load(i)
    var out = f32_at(args.a0)
    if args.n1 != 0:
        total = out.unsafe_load(g) + total
    out.unsafe_store(g, total)
