"""AdamW, PyTorch's form (decoupled weight decay), one body per `w` parameters (each lane on its own).

    p ← p·(1 − lr·λ)
    m ← β1·m + (1 − β1)·g
    v ← β2·v + (1 − β2)·g²
    p ← p − (lr / c1) · m / (√v / √c2 + ε)          c1 = 1 − β1^t, c2 = 1 − β2^t

The scalars (1 − β1, 1 − β2, 1 − lr·λ, lr/c1, √c2) are computed once on the host
in float64 and rounded to float32, so every device reads the same bits. Those that
change with the step or the learning rate, lr/c1, √c2 and 1 − lr·λ, come as scalars, or
from the buffer `step_scalars` when it is given (a recorded plan replays the same launch
every step, so the host writes each step's three there before the replay). With the
buffer `verdict` (kernels/verdict.mojo) holding 0, the update leaves everything as it was.
"""

from engine.launch import Args, Interface
from engine.numerics import sqrt_rn

comptime ADAMW = Interface(
    "params grads m v step_scalars verdict", "",
    "beta1 beta2 one_minus_beta1 one_minus_beta2 decay step_size sqrt_c2 eps",
)


def adamw[w: SIMDLength](i: Int, args: Args):
    var params = args.f32(0)
    var grads = args.f32(1)
    var m = args.f32(2)
    var v = args.f32(3)
    var beta1 = args.scalar(0)
    var beta2 = args.scalar(1)
    var one_minus_beta1 = args.scalar(2)
    var one_minus_beta2 = args.scalar(3)
    var decay = args.scalar(4)        # 1 − lr·λ
    var step_size = args.scalar(5)    # lr / c1
    var sqrt_c2 = args.scalar(6)
    var eps = args.scalar(7)
    if args.given(4):                 # the step's [lr / c1, √c2, 1 − lr·λ] from step_scalars
        var step_scalars = args.f32(4)
        step_size = step_scalars.unsafe_load(0)
        sqrt_c2 = step_scalars.unsafe_load(1)
        decay = step_scalars.unsafe_load(2)

    if args.given(5) and args.f32(5).unsafe_load(0) == 0:  # the step was refused on the device
        return

    var g = grads.unsafe_load[width=w](i)
    var m_new = beta1 * m.unsafe_load[width=w](i) + one_minus_beta1 * g
    var v_new = beta2 * v.unsafe_load[width=w](i) + one_minus_beta2 * (g * g)
    m.unsafe_store(i, m_new)
    v.unsafe_store(i, v_new)
    var decayed = params.unsafe_load[width=w](i) * decay
    params.unsafe_store(i, decayed - step_size * (m_new / (sqrt_rn(v_new) / sqrt_c2 + eps)))
