"""Embedding gather and its deterministic backward.

    forward:   out[t, :] = table[ids[t], :]                                  (one body per token)
    backward:  dtable[v, c] (+)= Σ_{t : ids[t] = v, t ascending} dout[t, c]   (one body per (id, column))

The backward needs no atomics: the host hands the tokens grouped by id (a stable
sort, so each group ascends), as CSR `order` and `offsets`, and each id sums its
own group in that order, one column per task so neighbouring tasks read neighbouring addresses.
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


def embedding_backward(task: Int, args: Args):
    var W = args.n0
    var v = task // W
    var column = task % W
    var order = i32_at(args.a2)
    var offsets = i32_at(args.a3)
    var total = Float32(0)
    for position in range(Int(offsets.unsafe_load(v)), Int(offsets.unsafe_load(v + 1))):
        total += f32_at(args.a1 + (Int(order.unsafe_load(position)) * W + column) * 4).unsafe_load(0)
    var dtable = f32_at(args.a0)
    if args.n1 != 0:
        total = dtable.unsafe_load(task) + total
    dtable.unsafe_store(task, total)
