"""Calibrated choices: the masked head's distribution restricted to an item's legal bytes.

Item c offers the bytes x_k, k ∈ [o_c, o_(c+1)), of `choice_bytes`; its logits row z [V] is the masked
head at the MASK position appended to the item. With m = max_k z_(x_k):

    p_k = e^(z_(x_k) − m) / Σ_k' e^(z_(x_k') − m)          (the softmax over the legal bytes only)
    loss_c = −Σ_k t_k log p_k = Σ_k t_k (lse − z_(x_k)),   lse = m + log Σ_k e^(z_(x_k) − m)
    dz_(x_k) = γ·(p_k − t_k),  dz = 0 at every byte the item does not offer        (γ = grad_scale)

Both Σ are `canonical_reduce` over k. The targets t are optional: without them (text_choose) only
the probabilities are written.
"""

from engine.launch import Args, Interface
from engine.reduction import canonical_reduce, canonical_sum
from engine import numerics

comptime CHOICE_LOSS = Interface("probabilities losses d_logits logits offsets choice_bytes targets", "vocab", "grad_scale")


def choice_loss(c: Int, args: Args):
    """probabilities [Σ choices]; losses [C] and d_logits [C, V] (optional, with targets [Σ choices]);
    logits [C, V]; offsets int32 [C + 1]; choice_bytes int32 [Σ choices]."""
    var V = args.size(0)
    var grad_scale = args.scalar(0)
    var probabilities = args.f32(0)
    var z = args.f32(3).unsafe_offset(c * V)
    var begin = Int(args.i32(4).unsafe_load(c))
    var n = Int(args.i32(4).unsafe_load(c + 1)) - begin
    var legal = args.i32(5).unsafe_offset(begin)

    var m = z.unsafe_load(Int(legal.unsafe_load(0)))
    for k in range(1, n):
        m = max(m, z.unsafe_load(Int(legal.unsafe_load(k))))

    var p = probabilities.unsafe_offset(begin)  # holds e^(z − m) until the sum is known
    for k in range(n):
        p.unsafe_store(k, numerics.exp(z.unsafe_load(Int(legal.unsafe_load(k))) - m))
    var total = canonical_sum(p, n)
    for k in range(n):
        p.unsafe_store(k, p.unsafe_load(k) / total)
    if not args.given(6):
        return
    var targets = args.f32(6).unsafe_offset(begin)
    var lse = numerics.log(total) + m

    def cross_entropy_term(k: Int) {imm z, imm legal, imm targets, imm lse} -> Float32:
        return targets.unsafe_load(k) * (lse - z.unsafe_load(Int(legal.unsafe_load(k))))

    args.f32(1).unsafe_store(c, canonical_reduce(cross_entropy_term, n))
    if args.given(2):
        var dz = args.f32(2).unsafe_offset(c * V)
        for i in range(V):
            dz.unsafe_store(i, Float32(0))
        for k in range(n):
            dz.unsafe_store(Int(legal.unsafe_load(k)), (p.unsafe_load(k) - targets.unsafe_load(k)) * grad_scale)
