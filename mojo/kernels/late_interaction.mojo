"""Late interaction: hard MaxSim between the token vectors of query and document segments.

Query segment i owns the query token rows [qs_i, qs_i + qn_i) of `queries` [Nq, W], document segment j
the rows [ds_j, ds_j + dn_j) of `documents` [Nd, W] (qn or dn zero: the segment is not on that side).
Every row is a unit vector, so a dot product is a cosine.

    forward   best_aj = max_(b ∈ j) q_a·d_b     arg_aj = the lowest such b (−1 when j has no rows)
              score_ij = Σ_(a ∈ i) best_aj       (0 unless i is a query and j a document)
    backward  dq_a = Σ_j dscore_(i(a) j) · d_(arg_aj)
              dd_b = Σ_(a : arg_(a j(b)) = b) dscore_(i(a) j(b)) · q_a

The gradient of a maximum goes to the one document row that attains it; on a tie, to the lowest
index, so the result is canonical. The canonical order: every dot product is an fma chain over the
width; every Σ is a chain in ascending index (j for dq, a for dd and the score), a product term
one fma into the running value. One CPU call or one GPU thread runs one task, so both give the same bits.
"""

from std.math import fma
from engine.launch import Args, Interface
from engine.reduction import fma_dot


comptime MAXSIM_FORWARD = Interface("best arg queries documents document_starts document_counts", "segments width", "")


def maxsim_forward(task: Int, args: Args):
    """One task per (query row a, segment j), task = a·S + j: best [Nq, S] and arg int32 [Nq, S]."""
    var S = args.size(0)
    var W = args.size(1)
    var best = args.f32(0)
    var arg = args.i32(1)
    var query = args.f32(2).unsafe_offset((task // S) * W)
    var documents = args.f32(3)
    var j = task % S
    var start = Int(args.i32(4).unsafe_load(j))
    var count = Int(args.i32(5).unsafe_load(j))
    var top = Float32(0)
    var where = -1
    for b in range(start, start + count):
        var s = fma_dot(query, documents.unsafe_offset(b * W), W)
        if where < 0 or s > top:
            top = s
            where = b
    best.unsafe_store(task, top)
    arg.unsafe_store(task, Int32(where))


comptime MAXSIM_SCORES = Interface("scores best query_starts query_counts document_counts", "segments", "")


def maxsim_scores(task: Int, args: Args):
    """One task per (query segment i, document segment j), task = i·S + j: scores [S, S]."""
    var S = args.size(0)
    var scores = args.f32(0)
    var best = args.f32(1)
    var i = task // S
    var j = task % S
    var start = Int(args.i32(2).unsafe_load(i))
    var count = Int(args.i32(3).unsafe_load(i))
    var total = Float32(0)
    if Int(args.i32(4).unsafe_load(j)) > 0:
        for a in range(start, start + count):
            total += best.unsafe_load(a * S + j)
    scores.unsafe_store(task, total)


comptime MAXSIM_BACKWARD_QUERIES = Interface("d_queries d_scores arg documents query_segment", "segments width", "")


def maxsim_backward_queries(a: Int, args: Args):
    """One task per query row a: d_queries [Nq, W] from d_scores [S, S]."""
    var S = args.size(0)
    var W = args.size(1)
    var dq = args.f32(0).unsafe_offset(a * W)
    var d_scores = args.f32(1).unsafe_offset(Int(args.i32(4).unsafe_load(a)) * S)
    var arg = args.i32(2).unsafe_offset(a * S)
    var documents = args.f32(3)
    for c in range(W):
        dq.unsafe_store(c, Float32(0))
    for j in range(S):
        var b = Int(arg.unsafe_load(j))
        if b >= 0:
            var g = d_scores.unsafe_load(j)
            var row = documents.unsafe_offset(b * W)
            for c in range(W):
                dq.unsafe_store(c, fma(g, row.unsafe_load(c), dq.unsafe_load(c)))


comptime MAXSIM_BACKWARD_DOCUMENTS = Interface(
    "d_documents d_scores arg queries query_segment document_segment", "segments width query_rows", ""
)


def maxsim_backward_documents(b: Int, args: Args):
    """One task per document row b: d_documents [Nd, W] from d_scores [S, S]; document_segment int32 [Nd]."""
    var S = args.size(0)
    var W = args.size(1)
    var Nq = args.size(2)
    var dd = args.f32(0).unsafe_offset(b * W)
    var d_scores = args.f32(1)
    var arg = args.i32(2)
    var queries = args.f32(3)
    var query_segment = args.i32(4)
    var j = Int(args.i32(5).unsafe_load(b))
    for c in range(W):
        dd.unsafe_store(c, Float32(0))
    for a in range(Nq):
        if Int(arg.unsafe_load(a * S + j)) == b:
            var g = d_scores.unsafe_load(Int(query_segment.unsafe_load(a)) * S + j)
            var row = queries.unsafe_offset(a * W)
            for c in range(W):
                dd.unsafe_store(c, fma(g, row.unsafe_load(c), dd.unsafe_load(c)))
