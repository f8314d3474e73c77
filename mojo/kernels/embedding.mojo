"""Embedding gather and its deterministic backward.

    forward:   out[t, :] = table[ids[t], :] (+ rows[row_of[t], :] where row_of[t] ≥ 0)   (one body per token)
    backward:  dtable[v, c] (+)= Σ_{t : ids[t] = v, t ascending} dout[t, c]   (one body per (id, column))

The backward needs no atomics: the host hands the tokens grouped by id (a stable
sort, so each group ascends), as CSR `order` and `offsets`, and each id sums its
own group in that order, one column per task so neighbouring tasks read neighbouring addresses.
"""

from engine.launch import Args, Interface

comptime EMBEDDING_FORWARD = Interface("out table ids rows row_of", "width", "")


def embedding_forward(t: Int, args: Args):
    """rows and row_of are optional: the media tokens add their patch embedding to their modality's id row."""
    var W = args.size(0)
    var out = args.f32(0).unsafe_offset(t * W)
    var row = Int(args.i32(2).unsafe_load(t))
    var source = args.f32(1).unsafe_offset(row * W)
    var extra = Int(args.i32(4).unsafe_load(t)) if args.given(4) else -1
    if extra >= 0:
        var added = args.f32(3).unsafe_offset(extra * W)
        for i in range(W):
            out.unsafe_store(i, source.unsafe_load(i) + added.unsafe_load(i))
    else:
        for i in range(W):
            out.unsafe_store(i, source.unsafe_load(i))


comptime EMBEDDING_BACKWARD = Interface("dtable d_out order offsets", "width accumulate", "")


def embedding_backward(task: Int, args: Args):
    """dtable [V, W]; d_out [N, W]; order int32 [N] and offsets int32 [V + 1]: the tokens grouped by id."""
    var dtable = args.f32(0)
    var d_out = args.f32(1)
    var order = args.i32(2)
    var offsets = args.i32(3)
    var W = args.size(0)
    var accumulate = args.flag(1)
    var v = task // W
    var column = task % W
    var total = Float32(0)
    for position in range(Int(offsets.unsafe_load(v)), Int(offsets.unsafe_load(v + 1))):
        total += d_out.unsafe_load(Int(order.unsafe_load(position)) * W + column)
    if accumulate:
        total = dtable.unsafe_load(task) + total
    dtable.unsafe_store(task, total)
