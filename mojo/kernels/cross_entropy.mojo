"""Cross-entropy of a row of logits z against target t (t < 0: ignored, loss 0, no gradient):

    loss = log Σ e^z − z_t        dz = (softmax(z) − onehot(t))·scale

A row kernel (`launch_rows`): on a GPU a warp takes a row, thread l playing lane l of the canonical sum and writing
the columns l, l+32, …; on the CPU one call takes the row. The max and the Σ are `row_max_of` and `row_reduce`,
the canonical order (`engine.reduction`), so every device gives the same bits.
"""

from engine.launch import Args, Interface
from engine.reduction import row_max_of, row_reduce, row_stride
from engine import numerics


comptime CROSS_ENTROPY = Interface("losses dlogits logits targets", "vocab", "grad_scale")


def cross_entropy[warp: Bool](r: Int, lane: Int, args: Args):
    """dlogits is optional: without it only the losses are written. A row kernel: on a GPU a warp takes a row
    (thread l the canonical sum's lane l and the columns l, l+32, …), so its 2·V exponentials are not one thread's
    chain of loads and stores (a thread a row took 67 µs over the byte LM's 256 logits)."""
    var V = args.size(0)
    var losses = args.f32(0)
    var z = args.f32(2).unsafe_offset(r * V)
    var target = Int(args.i32(3).unsafe_load(r))
    var grad_scale = args.scalar(0)
    var m = row_max_of[warp](z, V, lane)

    def shifted_exp(i: Int) {imm z, imm m} -> Float32:
        return numerics.exp(z.unsafe_load(i) - m)

    var total = row_reduce[warp](shifted_exp, V, lane)
    if lane == 0:
        var loss = Float32(0)
        if target >= 0:
            loss = (numerics.log(total) + m) - z.unsafe_load(target)
        losses.unsafe_store(r, loss)
    if args.given(1):
        var dz = args.f32(1).unsafe_offset(r * V)
        for i in range(lane, V, row_stride[warp]()):
            var g = Float32(0)
            if target >= 0:
                var p = numerics.exp(z.unsafe_load(i) - m) / total
                g = (p - Float32(1) if i == target else p) * grad_scale
            dz.unsafe_store(i, g)
