"""Row kernels: RMSNorm, softmax, cross-entropy, and column sums (one body per row or column).

RMSNorm over a row x of width W with gain w:
    r = 1/√(Σx²/W + ε)            y = x·r·w
    backward, with ĝ = dy·w:      dx = r·(ĝ − x·r²·Σ(ĝ·x)/W)      dw = Σ_rows dy·x·r
Softmax over a row:
    y = e^(x−max)/Σe^(x−max)      dx = y·(dy − Σ dy·y)
Cross-entropy of a row of logits z against target t (t < 0: ignored, loss 0, no gradient):
    loss = log Σ e^z − z_t        dz = (softmax(z) − onehot(t))·scale
Every Σ here is `canonical_reduce`: 32 strided lanes folded by halves.
Column sums (gradients of gains and biases) run in two stages with a fixed
chunk of rows, so their order is fixed too: Σ over chunks of Σ inside a chunk.
"""

from engine.device import f32_at, i32_at
from engine.launch import Args
from engine.reduction import canonical_reduce, row_max
from engine import numerics

comptime COLUMN_CHUNK = 256


def rmsnorm_forward(r: Int, args: Args):
    """a0 = y [R,W], a1 = rstd [R], a2 = x [R,W], a3 = w [W]; n0 = W; x0 = ε."""
    var W = args.n0
    var x = f32_at(args.a2 + r * W * 4)
    var y = f32_at(args.a0 + r * W * 4)
    var w = f32_at(args.a3)

    def square(i: Int) {imm x} -> Float32:
        var v = x.unsafe_load(i)
        return v * v

    var rstd = numerics.rsqrt(canonical_reduce(square, W) / Float32(W) + args.x0)
    f32_at(args.a1).unsafe_store(r, rstd)
    for i in range(W):
        y.unsafe_store(i, (x.unsafe_load(i) * rstd) * w.unsafe_load(i))


def rmsnorm_backward(r: Int, args: Args):
    """a0 = dx [R,W], a1 = dw_rows [R,W] (dy·x·r, for column_sum), a2 = dy, a3 = x, a4 = w, a5 = rstd; n0 = W."""
    var W = args.n0
    var dx = f32_at(args.a0 + r * W * 4)
    var dw_rows = f32_at(args.a1 + r * W * 4)
    var dy = f32_at(args.a2 + r * W * 4)
    var x = f32_at(args.a3 + r * W * 4)
    var w = f32_at(args.a4)
    var rstd = f32_at(args.a5).unsafe_load(r)

    def projection(i: Int) {imm dy, imm w, imm x} -> Float32:
        return (dy.unsafe_load(i) * w.unsafe_load(i)) * x.unsafe_load(i)

    var mean_projection = canonical_reduce(projection, W) / Float32(W)
    var coefficient = (rstd * rstd) * mean_projection
    for i in range(W):
        var xi = x.unsafe_load(i)
        var gi = dy.unsafe_load(i)
        dx.unsafe_store(i, rstd * (gi * w.unsafe_load(i) - xi * coefficient))
        dw_rows.unsafe_store(i, gi * (xi * rstd))


def softmax_forward(r: Int, args: Args):
    """a0 = y [R,N], a1 = x [R,N]; n0 = N."""
    var N = args.n0
    var x = f32_at(args.a1 + r * N * 4)
    var y = f32_at(args.a0 + r * N * 4)
    var m = row_max(x, N)
    for i in range(N):
        y.unsafe_store(i, numerics.exp(x.unsafe_load(i) - m))

    def value(i: Int) {imm y} -> Float32:
        return y.unsafe_load(i)

    var total = canonical_reduce(value, N)
    for i in range(N):
        y.unsafe_store(i, y.unsafe_load(i) / total)


def softmax_backward(r: Int, args: Args):
    """a0 = dx [R,N], a1 = y [R,N], a2 = dy [R,N]; n0 = N."""
    var N = args.n0
    var dx = f32_at(args.a0 + r * N * 4)
    var y = f32_at(args.a1 + r * N * 4)
    var dy = f32_at(args.a2 + r * N * 4)

    def product(i: Int) {imm y, imm dy} -> Float32:
        return dy.unsafe_load(i) * y.unsafe_load(i)

    var dot = canonical_reduce(product, N)
    for i in range(N):
        dx.unsafe_store(i, y.unsafe_load(i) * (dy.unsafe_load(i) - dot))


def cross_entropy(r: Int, args: Args):
    """a0 = loss [R], a1 = dz [R,V] (0: no gradient), a2 = z [R,V], a3 = targets int32 [R]; n0 = V; x0 = scale."""
    var V = args.n0
    var z = f32_at(args.a2 + r * V * 4)
    var target = Int(i32_at(args.a3).unsafe_load(r))
    var m = row_max(z, V)

    def shifted_exp(i: Int) {imm z, imm m} -> Float32:
        return numerics.exp(z.unsafe_load(i) - m)

    var total = canonical_reduce(shifted_exp, V)
    var loss = Float32(0)
    if target >= 0:
        loss = (numerics.log(total) + m) - z.unsafe_load(target)
    f32_at(args.a0).unsafe_store(r, loss)
    if args.a1 != 0:
        var dz = f32_at(args.a1 + r * V * 4)
        for i in range(V):
            var g = Float32(0)
            if target >= 0:
                var p = numerics.exp(z.unsafe_load(i) - m) / total
                g = (p - Float32(1) if i == target else p) * args.x0
            dz.unsafe_store(i, g)


def column_partial_sums(task: Int, args: Args):
    """Stage 1, one task per (chunk, column): a0 = partial [chunks,C], a1 = x [R,C]; n0 = R, n1 = C."""
    var R = args.n0
    var C = args.n1
    var chunk = task // C
    var column = task % C
    var begin = chunk * COLUMN_CHUNK
    var x = f32_at(args.a1)

    def value(i: Int) {imm x, imm begin, imm C, imm column} -> Float32:
        return x.unsafe_load((begin + i) * C + column)

    f32_at(args.a0).unsafe_store(task, canonical_reduce(value, min(COLUMN_CHUNK, R - begin)))


def column_sums_finish(column: Int, args: Args):
    """Stage 2, one task per column: a0 = out [C], a1 = partial [chunks,C]; n0 = chunks, n1 = C, n2 = accumulate."""
    var C = args.n1
    var partial = f32_at(args.a1)

    def value(chunk: Int) {imm partial, imm C, imm column} -> Float32:
        return partial.unsafe_load(chunk * C + column)

    var total = canonical_reduce(value, args.n0)
    var out = f32_at(args.a0)
    if args.n2 != 0:
        total = out.unsafe_load(column) + total
    out.unsafe_store(column, total)
