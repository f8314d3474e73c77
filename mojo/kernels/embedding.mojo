"""Embedding gather and its deterministic backward.

    forward:   out[t, :] = table[ids[t], :] (+ rows[row_of[t], :] where row_of[t] ≥ 0)   (one row body per token)
    backward:  dtable[v, c] (+)= Σ_{t : ids[t] = v, t ascending} dout[t, c]   (one body per (id, column))

The backward needs no atomics: the tokens come grouped by id (a stable sort, so each group ascends), as CSR
`order` and `offsets`, and each id sums its own group in that order, one column per task so neighbouring tasks read
neighbouring addresses. The groups are the host's (kernels.embedding_groups), or for ids already on the device,
token_groups' (the same arrays: a stable counting sort).

Fast mode's backward sums in another fixed order, for parallelism (a frequent byte's group holds thousands of
tokens, one sequential chain in the identical order): each group is cut into chunks of CHUNK tokens (the
host's `chunk_starts`, CSR over `order`; `id_chunks`, CSR of each id's chunks), a task sums one (chunk, column)
over its tokens ascending from +0 into `partial`, then a task per (id, column) sums its chunks ascending from +0:

    dtable[v, c] (+)= Σ_{chunks k of v, ascending} Σ_{t in chunk k, ascending} dout[t, c]
"""

from engine.launch import Args, Interface
from engine.reduction import row_stride
from max.gpu.primitives.warp import shuffle_up, shuffle_xor

comptime EMBEDDING_FORWARD = Interface("out table ids rows row_of", "width", "")


def embedding_forward[warp: Bool](t: Int, lane: Int, args: Args):
    """rows and row_of are optional: the media tokens add their patch embedding to their modality's id row. A row
    kernel: a GPU warp copies a token's row (thread l the columns l, l+32, …); one thread a row waited on each
    load before its store, W times."""
    var W = args.size(0)
    var out = args.f32(0).unsafe_offset(t * W)
    var row = Int(args.i32(2).unsafe_load(t))
    var source = args.f32(1).unsafe_offset(row * W)
    var extra = Int(args.i32(4).unsafe_load(t)) if args.given(4) else -1
    if extra >= 0:
        var added = args.f32(3).unsafe_offset(extra * W)
        for i in range(lane, W, row_stride[warp]()):
            out.unsafe_store(i, source.unsafe_load(i) + added.unsafe_load(i))
    else:
        for i in range(lane, W, row_stride[warp]()):
            out.unsafe_store(i, source.unsafe_load(i))


comptime TOKEN_GROUPS = Interface("order offsets ids", "tokens vocabulary", "")


def token_groups[warp: Bool](v: Int, lane: Int, args: Args):
    """Row v ≤ V of the tokens grouped by id, as kernels.embedding_groups finds them on the host from the n ids
    (each in [0, V)): offsets[v] = the count of ids below v (offsets[V] = n), and for v < V order[offsets[v] + j] =
    the j-th token, ascending, whose id is v. A row kernel: a GPU warp's lane l counts, then places, the l-th of 32
    contiguous blocks of tokens (where its block's first match goes: the matches of the blocks before, an
    exclusive prefix sum over the lanes by shuffles); one CPU call takes all n tokens as one block."""
    var order = args.i32(0)
    var ids = args.i32(2)
    var n = args.size(0)
    var lanes = row_stride[warp]()
    var per_lane = (n + lanes - 1) // lanes
    var first = min(n, lane * per_lane)
    var last = min(n, first + per_lane)
    var below = 0
    var matches = 0
    for t in range(first, last):
        var id = Int(ids.unsafe_load(t))
        below += 1 if id < v else 0
        matches += 1 if id == v else 0
    var before = 0  # matches in the blocks of the lanes below this one
    comptime if warp:
        var inclusive = Int32(matches)
        comptime for level in range(5):
            var lower = shuffle_up(inclusive, UInt32(1 << level))
            if lane >= (1 << level):
                inclusive += lower
        before = Int(inclusive) - matches
        var total = Int32(below)
        comptime for level in range(5):
            total += shuffle_xor(total, UInt32(1 << level))
        below = Int(total)
    if lane == 0:
        args.i32(1).unsafe_store(v, Int32(below))
    if v < args.size(1):
        var at = below + before
        for t in range(first, last):
            if Int(ids.unsafe_load(t)) == v:
                order.unsafe_store(at, Int32(t))
                at += 1


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


comptime CHUNK = 64  # tokens of one partial sum of fast mode's backward (exported to Python)
comptime EMBEDDING_CHUNK_SUMS = Interface("partial d_out order chunk_starts", "width", "")


def embedding_chunk_sums(task: Int, args: Args):
    """Fast mode, stage 1, a task per (chunk, column): partial [chunks, W] of the chunk's tokens."""
    var partial = args.f32(0)
    var d_out = args.f32(1)
    var order = args.i32(2)
    var chunk_starts = args.i32(3)
    var W = args.size(0)
    var chunk = task // W
    var column = task % W
    var total = Float32(0)
    for position in range(Int(chunk_starts.unsafe_load(chunk)), Int(chunk_starts.unsafe_load(chunk + 1))):
        total += d_out.unsafe_load(Int(order.unsafe_load(position)) * W + column)
    partial.unsafe_store(task, total)


comptime EMBEDDING_CHUNKS_FINISH = Interface("dtable partial id_chunks", "width accumulate", "")


def embedding_chunks_finish(task: Int, args: Args):
    """Fast mode, stage 2, a task per (id, column): dtable [V, W] (+)= the id's chunks of partial, ascending."""
    var dtable = args.f32(0)
    var partial = args.f32(1)
    var id_chunks = args.i32(2)
    var W = args.size(0)
    var accumulate = args.flag(1)
    var v = task // W
    var column = task % W
    var total = Float32(0)
    for chunk in range(Int(id_chunks.unsafe_load(v)), Int(id_chunks.unsafe_load(v + 1))):
        total += partial.unsafe_load(chunk * W + column)
    if accumulate:
        total = dtable.unsafe_load(task) + total
    dtable.unsafe_store(task, total)
