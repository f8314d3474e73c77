"""A step's update on the world's gradient: checked, clipped by its global norm, and applied whole.

Every replica holds the world's gradient after the reduction (``uform.training.world.GradientReducer``), so each
checks, scales and updates alike and stays identical to the others.
"""

from __future__ import annotations

import numpy as np

from ..errors import ErrorCode, UFormError
from ..nn.resident import applied_whole
from .schedule import learning_rate


def apply_update(replicas, run, step: int, reduce_gradients, commit) -> float:
    """Reduce the replicas' gradients over the world; refuse one that is not finite (INVALID_ARGUMENT, nothing
    updated); scale it by ``gradient_clip_norm / (norm + 1e-6)`` where its global L2 norm passes the run's
    ``Schedule.gradient_clip_norm`` (as PyTorch's ``clip_grad_norm_``); then AdamW at the schedule's rate on every
    replica and `commit()` (the trainer's step count), applied whole even under Ctrl-C. Answers the rate."""
    reduce_gradients()
    model = replicas[0]
    problem = model.gradient_problem()
    if problem is not None:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"step {step}: {problem}; nothing was updated")
    rate = learning_rate(run.schedule, step)
    clip, factor = run.schedule.gradient_clip_norm, 1.0
    if clip > 0:
        norm = model.gradient_norm()
        if not np.isfinite(norm):
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"step {step}: the gradient's squares overflow float32, so "
                                                         "it has no norm to clip by; nothing was updated")
        factor = clip / (norm + 1e-6)
    with applied_whole():
        if factor < 1.0:
            for replica in replicas:
                replica.scale_gradient(factor)
        for replica in replicas:
            replica.adamw(step=step, lr=rate)
        commit()
    return rate
