"""The learning rate of every optimizer step: a linear warmup, then a cosine decay.

With the schedule derived -- peak ``lr``, floor ``min``, ``warmup`` and ``steps``
-- the rate applied at ``step``, counted from one, is::

    step <= warmup:           lr * step / warmup
    warmup < step <= steps:   min + 0.5 * (lr - min) * (1 + cos(pi * (step - warmup) / (steps - warmup)))
    step > steps:             min

so the warmup's last step reaches the peak, the cosine starts just below it and
lands exactly on the floor at ``step == steps``, and a run resumed past its
planned length keeps the floor. With no warmup the first step is already on the
cosine.
"""

from __future__ import annotations

import numpy as np

from .config import Schedule
from ..errors import ErrorCode, UFormError


def learning_rate(schedule: Schedule, step):
    """The rate applied at ``step`` (an int, or an array of them for many at once), per the module doc."""
    schedule = schedule.derived()
    steps = np.asarray(step)
    if steps.dtype.kind not in "iu" or np.any(steps < 1):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"step: counted from one, got {step!r}")
    peak, floor = schedule.learning_rate, schedule.min_learning_rate
    warmup, total = schedule.warmup_steps, schedule.steps
    decay_steps = max(total - warmup, 1)
    progress = np.clip((steps - warmup) / decay_steps, 0.0, 1.0)
    cosine = floor + 0.5 * (peak - floor) * (1.0 + np.cos(np.pi * progress))
    rates = np.where(steps <= warmup, peak * steps / max(warmup, 1), cosine)
    return float(rates) if rates.ndim == 0 else rates
