"""The resident training state of a model: parameters, gradient and AdamW moments on one device.

A model keeps every parameter tensor in one flat float32 vector, laid out by its *registry*: one
``{"name", "shape", "offset", "size"}`` dict per tensor, in flat order, each tensor a contiguous
row-major slice (``tensor_registry`` builds it from names and shapes). ``ResidentState`` puts four
such vectors on a device (the parameters, their gradient, AdamW's first and second moments), names
every tensor of the first two as a view, and applies the AdamW update in place. The state enters
and leaves the device whole, as a ``HostState`` of three flat arrays: both models are resident
states with their passes on top (``uform.training.encoder.EncoderModel``, ``uform.lm.model.DeviceModel``),
and both checkpoint formats write and read a ``HostState``.
"""

from __future__ import annotations

import _signal
import math
import signal
import threading
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .. import kernels as K
from ..engine import Buffer, Device

STATE_ARRAYS = ("parameters", "m", "v")
"""The arrays of a HostState, in the order checkpoints store them."""

MAX_STEPS = 2**31 - 1
"""The most optimizer steps a state may record; a larger count (or a negative one) is refused as corrupt."""
MAX_LEARNING_RATE = 1.0
"""The largest learning rate either trainer accepts: AdamW moves a weight by about the rate each step, so a
larger one outweighs any initialised weight in one step (and past float32's range, writes inf or NaN)."""
MIN_EPS = float(np.finfo(np.float32).tiny)
"""The smallest AdamW ε: a zero (or a subnormal a GPU flushes to zero) makes 0/0 = NaN of a zero gradient."""
GUARD_COLUMNS = 4096
"""The gradient check sums the flat gradient down to this many column sums (one two-stage reduction)."""
LARGEST_SQUARABLE = K.LARGEST_SQUARABLE
"""The largest magnitude whose square float32 holds (√ of the largest float32): AdamW's second moment holds the
gradient squared. The engine's constant: the device's verdict on a replayed step (``update_launches``) uses it too."""


def tensor_registry(shapes: Iterable[tuple[str, tuple[int, ...]]]) -> list[dict]:
    """Name, shape, offset and size of every tensor of (name, shape) pairs, laid end to end in that order."""
    registry, offset = [], 0
    for name, shape in shapes:
        size = math.prod(shape)
        registry.append({"name": name, "shape": shape, "offset": offset, "size": size})
        offset += size
    return registry


def registry_size(registry: list[dict]) -> int:
    """Values in the flat vector a registry lays out."""
    return registry[-1]["offset"] + registry[-1]["size"] if registry else 0


def named_tensors(flat, registry: list[dict]) -> dict:
    """Every tensor of a flat host array (numpy, or torch) by name, as a view shaped by the registry."""
    return {entry["name"]: flat[entry["offset"]:entry["offset"] + entry["size"]].reshape(entry["shape"])
            for entry in registry}


def every_tensor(name: str) -> bool:
    """The default decay rule: weight decay applies to every tensor."""
    return True


@contextmanager
def applied_whole():
    """Hold a Ctrl-C (SIGINT) until the block ends, so an update of several launches and its step count are
    applied all or not at all: the KeyboardInterrupt arrives right after the block. Python delivers signals
    to the main thread only, so elsewhere there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    # The C function beneath signal.signal: the same handler swap without its enum conversions, which cost
    # about 8 µs a swap (a step of the byte LM on a GPU takes a few hundred).
    previous = _signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        _signal.signal(signal.SIGINT, previous)
        if held and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)
        elif held and callable(previous):
            previous(signal.SIGINT, held[0])


@dataclass(frozen=True)
class AdamW:
    """AdamW's constant hyperparameters (PyTorch's form); the learning rate comes with each step.

    The decoupled weight decay applies to the tensors `decays(name)` answers True for, and 0 to the rest."""

    betas: tuple[float, float]
    eps: float
    weight_decay: float
    decays: Callable[[str], bool] = every_tensor


@dataclass(frozen=True)
class DecayRun:
    """A contiguous run of the flat vector whose tensors all decay or all do not: one AdamW launch."""

    offset: int
    size: int
    decays: bool


def decay_runs(registry: list[dict], decays: Callable[[str], bool]) -> list[DecayRun]:
    """The flat vector cut into maximal runs of neighbouring tensors with the same decay rule."""
    runs: list[DecayRun] = []
    for entry in registry:
        decay = decays(entry["name"])
        if runs and runs[-1].decays == decay:
            runs[-1] = DecayRun(runs[-1].offset, runs[-1].size + entry["size"], decay)
        else:
            runs.append(DecayRun(entry["offset"], entry["size"], decay))
    return runs


@dataclass
class HostState:
    """The training state on the host: flat float32 parameters and AdamW moments, in registry order."""

    parameters: np.ndarray
    m: np.ndarray
    v: np.ndarray

    @classmethod
    def starting(cls, parameters: np.ndarray) -> HostState:
        """The state before the first step: these parameters, both moments zero."""
        return cls(parameters, np.zeros_like(parameters), np.zeros_like(parameters))

    def arrays(self) -> dict[str, np.ndarray]:
        """The three arrays by their STATE_ARRAYS names."""
        return {name: getattr(self, name) for name in STATE_ARRAYS}

    def first_bad_value(self, registry: list[dict]) -> str | None:
        """None for a state a step can continue from, else where it cannot: the first non-finite parameter
        or moment, or negative second moment, named by array, tensor and index."""
        for array, flat in self.arrays().items():
            bad = ~np.isfinite(flat)
            if array == "v":
                bad |= flat < 0
            if bad.any():
                index = int(np.argmax(bad))
                entry = next(e for e in registry if e["offset"] <= index < e["offset"] + e["size"])
                return f"{array}[{index}] (tensor {entry['name']}) is {flat[index]}"
        return None


class ResidentState:
    """Parameters, gradient and AdamW moments resident on `device` as flat buffers laid out by `registry`.

    ``parameters``, ``gradients``, ``m`` and ``v`` are the flat buffers; ``weights[name]`` and
    ``weight_grads[name]`` view one tensor of the parameters and of the gradient. A model's backward
    overwrites the gradient; ``adamw`` then updates parameters and moments in place."""

    def __init__(self, device: Device, registry: list[dict], state: HostState, adamw: AdamW, *,
                 training: bool = True, numerics: str = "identical", plans: str = "off"):
        """training=False keeps the parameters alone on the device (no gradient, no moments): a state
        that only runs forward passes, in a third of the memory. numerics: the run's numeric mode; `fast`
        says whether its fast-mode kernels run (fast mode on a GPU), else every kernel is identical.
        plans: how the model's steps replay (``uform.lm.model.step_plans``): "off" (launched from Python), "loop"
        or "graph"; with plans, ``update_launches`` and ``step_scalars`` serve the step's plan."""
        self.device = device
        self.plans = plans
        self.numerics = numerics
        self.fast = numerics == "fast" and device.is_gpu
        self.registry = registry
        self.training = training
        self.parameters = device.put(state.parameters)
        self.weights = self._views(self.parameters)
        self.optimizer = adamw
        self.decay_runs = decay_runs(registry, adamw.decays)
        if training:
            self.gradients = device.zeros(state.parameters.size)
            self.m = device.put(state.m)
            self.v = device.put(state.v)
            self.weight_grads = self._views(self.gradients)
            self._guard_sums, self._guard = self._gradient_sums(device)

    def _views(self, flat: Buffer) -> dict[str, Buffer]:
        return {entry["name"]: flat.view(entry["offset"], entry["shape"]) for entry in self.registry}

    def download_state(self) -> HostState:
        """Parameters and moments, copied to the host."""
        return HostState(self.parameters.numpy(), self.m.numpy(), self.v.numpy())

    def _gradient_sums(self, device: Device) -> tuple[Buffer, list[tuple]]:
        """The buffer of the gradient check's sums and its reductions: the gradient as rows of GUARD_COLUMNS,
        and the tail of fewer values as one column; each (gradient part, rows, columns, its sums, workspace)."""
        rows, tail = divmod(self.gradients.size, GUARD_COLUMNS)
        parts = [(start, count, columns) for start, count, columns in
                 ((0, rows, GUARD_COLUMNS), (rows * GUARD_COLUMNS, tail, 1)) if count]
        sums = device.empty(sum(columns for _, _, columns in parts))
        reductions, written = [], 0
        for start, count, columns in parts:
            reductions.append((self.gradients.view(start, count * columns), count, columns,
                               sums.view(written, columns), K.column_sum_workspace(device, count, columns)))
            written += columns
        return sums, reductions

    def gradient_problem(self) -> str | None:
        """None for a gradient AdamW can apply, else what is wrong with it. The gradient is summed down to
        GUARD_COLUMNS column sums on the device (plus one for a tail) and those are checked on the host: a
        NaN or an infinity always reaches its column's sum; a value too large to square in float32 (past
        LARGEST_SQUARABLE) does unless values of opposite signs in its column bring the sum back under."""
        self.sum_gradient()
        return self.summed_gradient_problem()

    def sum_gradient(self) -> None:
        """gradient_problem's launches: the gradient's column sums, on the device."""
        for part, rows, columns, out, partial in self._guard:
            K.column_sum(out, part, rows, columns, partial=partial)

    def summed_gradient_problem(self) -> str | None:
        """gradient_problem's verdict on the sums sum_gradient left on the device (downloads them)."""
        sums = self._guard_sums.numpy()
        if not np.all(np.isfinite(sums)):
            return "a gradient value is not finite"
        largest = float(np.max(np.abs(sums), initial=0.0))  # compared exactly, in float64, as the device does
        if largest > LARGEST_SQUARABLE:
            return f"a gradient value is too large to square in float32 (a column sums to {largest})"
        return None

    def gradient_norm(self) -> float:
        """The gradient's global L2 norm: its squares summed down to GUARD_COLUMNS column sums on the device
        (``kernels.column_sum``'s squares, through the check's reductions and into its sums, which it overwrites:
        call it after ``summed_gradient_problem`` has read them), those downloaded and summed in float64."""
        for part, rows, columns, out, partial in self._guard:
            K.column_sum(out, part, rows, columns, partial=partial, squares=True)
        return float(np.sqrt(np.sum(self._guard_sums.numpy(), dtype=np.float64)))

    def scale_gradient(self, factor: float) -> None:
        """gradient ×= factor (rounded to float32), in place."""
        K.scale(self.gradients, self.gradients, float(np.float32(factor)))

    def adamw(self, *, step: int, lr: float, verdict: Buffer | None = None, step_scalars: Buffer | None = None) -> None:
        """One AdamW update of every parameter from the gradient, one launch per decay run, in flat order. With a
        verdict (a replayed update, ``update_launches``): the step's scalars read from `step_scalars` [2, 3] (what
        ``step_scalars`` answers, written before each replay), whatever step and lr say, and nothing done on a
        refused verdict."""
        hyper = self.optimizer
        for run in self.decay_runs:
            K.adamw(self.parameters.view(run.offset, run.size), self.gradients.view(run.offset, run.size),
                    self.m.view(run.offset, run.size), self.v.view(run.offset, run.size), step=step, lr=lr,
                    betas=hyper.betas, eps=hyper.eps, weight_decay=hyper.weight_decay if run.decays else 0.0,
                    step_scalars=None if verdict is None else step_scalars.view(0 if run.decays else 3, 3),
                    verdict=verdict)

    def update_launches(self, losses: Buffer, verdict: Buffer, step_scalars: Buffer) -> None:
        """A replayed step's check and update, as launches for its plan: the gradient's sums (``sum_gradient``),
        the device's verdict on them and on the step's `losses` into `verdict` (``kernels.step_verdict``: 1 when
        ``summed_gradient_problem`` and the losses' check would pass on the host, else 0), and AdamW reading its
        scalars from `step_scalars` [2, 3] (written before each replay: ``step_scalars``) and doing nothing on a
        refused verdict."""
        self.sum_gradient()
        K.step_verdict(verdict, losses, self._guard_sums)
        self.adamw(step=1, lr=0.0, verdict=verdict, step_scalars=step_scalars)

    def step_scalars(self, *, step: int, lr: float) -> np.ndarray:
        """AdamW's scalars of `step` at `lr` for the update update_launches recorded, [2, 3] float32: a row for the
        runs that decay, a row for the rest (``kernels.adamw_step_scalars``)."""
        hyper = self.optimizer
        return np.array([K.adamw_step_scalars(step=step, lr=lr, betas=hyper.betas, weight_decay=decay)
                         for decay in (hyper.weight_decay, 0.0)])
