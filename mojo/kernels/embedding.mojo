"""Embedding gather and its deterministic backward.

    forward:   out[t, :] = table[ids[t], :]                                  (one body per token)
    backward:  dtable[v, :] (+)= Σ_{t : ids[t] = v, t ascending} dout[t, :]   (one body per id)

The backward needs no atomics: the host hands the tokens grouped by id (a stable
sort, so each group ascends), as CSR `order` and `offsets`, and each id sums its
own group in that order.
forward:  a0 = out [N,W], a1 = table [V,W], a2 = ids int32 [N]; n0 = W.
backward: a0 = dtable [V,W], a1 = dout [N,W], a2 = order int32 [N], a3 = offsets int32 [V+1]; n0 = W, n1 = accumulate.
"""

from engine.device import f32_at, i32_at
from engine.launch import Args


def embedding_forward(t: Int, args: Args):
    var W = args.n0
    var row = Int(i32_at(args.a2).unsafe_load(t))
    var source = f32_at(args.a1 + row * W * 4)
    var out = f32_at(args.a0 + t * W * 4)
    for i in range(W):
        out.unsafe_store(i, source.unsafe_load(i))


def embedding_backward(v: Int, args: Args):
    var W = args.n0
    var order = i32_at(args.a2)
    var offsets = i32_at(args.a3)
    var begin = Int(offsets.unsafe_load(v))
    var end = Int(offsets.unsafe_load(v + 1))
    var dtable = f32_at(args.a0 + v * W * 4)
    for i in range(W):
        var total = Float32(0)
        for position in range(begin, end):
            total += f32_at(args.a1 + Int(order.unsafe_load(position)) * W * 4).unsafe_load(i)
        if args.n1 != 0:
            total = dtable.unsafe_load(i) + total
        dtable.unsafe_store(i, total)
