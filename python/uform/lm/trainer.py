"""``LanguageModelTrainer``: mojolearn's small byte language-model trainer on the uform engine.

The caller supplies everything: the initial parameters, the ids of every step
and a ``data_schedule`` describing them. There is no hidden initialisation,
tokenizer, padding or randomness inside. Each step runs the model's forward,
mean cross-entropy, backward and AdamW update on the trainer's device.

A *resident session* keeps the parameters, the AdamW moments and the last
gradient on the device between steps (the default on a GPU): only ids go in
and the loss comes out, and the state reaches the host on ``export_state``,
``export_gradients``, the checkpoint writers and ``close``. With
``resident=False`` the state lives on the host and each step uploads it, runs,
and downloads it again. Both paths run the same kernels and give the same bits,
on the CPU and on a GPU.

Failure semantics (``docs/guarantees.md``): every public method holds the
trainer's lock, so calls from several threads run one at a time and none is
lost. Arguments are checked before anything runs, with a ``UFormError`` that
is also the ValueError or TypeError mojolearn names. A step whose loss or
gradient is not finite is rolled back (nothing was updated, since the update
is the step's last action), and the update and the step count are applied
whole even under Ctrl-C. A failed device allocation raises MemoryError and
changes nothing; any other error from the engine marks the device context
lost (``DEVICE_LOST``), after which every call raises until
``load_state_dict``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
import threading

import numpy as np

from .. import engine
from ..errors import ErrorCode, UFormRuntimeError, type_error, value_error
from ..executor import default_executor, executor_from, numeric_mode, run_numerics
from ..kernels import device_work
from ..nn.resident import AdamW, HostState, applied_whole
from . import checkpoint as ckpt
from .config import LanguageModelConfig, flatten_parameters, parameter_registry, split_parameters
from .model import DeviceModel, step_plans

LOGITS_MAX_BATCH = 1024
LOGITS_MAX_CELLS = 268_435_456
STEP_RESULTS = ("full", "lean")


def serialised(method):
    """The method run holding the trainer's lock: calls from several threads run one at a time."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


def refused(message: str, code: ErrorCode = ErrorCode.INVALID_ARGUMENT) -> UFormRuntimeError:
    """A call refused in the state the trainer is in (mojolearn raises RuntimeError there)."""
    return UFormRuntimeError(code, message)


class LanguageModelTrainer:
    """FP32 decoder language-model trainer (AdamW, mean cross-entropy); see the module docstring."""

    def __init__(self, parameters, *, data_schedule, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 shape=None, resident=None, step_result=None, executor=None, numerics=None):
        shape = LanguageModelConfig() if shape is None else shape
        if not isinstance(shape, LanguageModelConfig):
            raise type_error(f"shape must be a LanguageModelConfig or None, got {type(shape).__name__}")
        flat = self._flat_parameters(parameters, shape)
        state = ckpt.validate_state({
            "format": ckpt.FORMAT, "config": shape.to_dict(),
            "hyperparameters": {"lr": lr, "betas": list(betas) if isinstance(betas, (list, tuple)) else betas,
                                "eps": eps, "weight_decay": weight_decay},
            "step": 0, **HostState.starting(flat).arrays(),
            "data_schedule": data_schedule, "metadata": {},
        }, shape)
        self._start(state, executor, resident, step_result, numeric_mode() if numerics is None else numerics)

    def _start(self, state: dict, executor, resident, step_result, numerics) -> None:
        """numerics: the run's numeric mode, or None to keep the state's (docs/numerics.md)."""
        self._lock = threading.RLock()
        self._executor = default_executor() if executor is None else executor_from(executor)
        if len(self._executor.devices) > 1:  # refused, not trained on the first alone as it silently was
            raise value_error(f"executor: {self._executor!r} has {len(self._executor.devices)} devices; the language "
                              "model trains on one (pass an executor of one device, e.g. Executor.for_vram([0]))",
                              ErrorCode.UNSUPPORTED)
        self._resident, self._step_result = self._session_mode(resident, step_result)
        self._numerics = run_numerics(state_numerics(state) if numerics is None else numerics, self._executor)
        self._adopt(state)

    # ---- construction helpers ----------------------------------------------------------------------

    @staticmethod
    def _flat_parameters(parameters, shape: LanguageModelConfig) -> np.ndarray:
        if isinstance(parameters, dict):
            return flatten_parameters(parameters, shape)
        flat = np.asarray(parameters)
        if flat.shape != (shape.n_total,):
            raise value_error(f"parameters must be a flat array of shape.n_total = {shape.n_total} values, "
                              f"got shape {flat.shape}")
        if not np.issubdtype(flat.dtype, np.floating):
            raise value_error(f"parameters must be floating point, got {flat.dtype}")
        return flat.astype(np.float32)

    def _session_mode(self, resident, step_result) -> tuple[bool, str]:
        if resident is None:
            resident = self._executor.is_gpu
        resident = bool(resident)
        if step_result is None:
            step_result = "lean" if resident else "full"
        if step_result not in STEP_RESULTS:
            raise value_error(f"step_result must be one of {STEP_RESULTS} or None, got {step_result!r}")
        if step_result == "lean" and not resident:
            raise value_error('step_result="lean" requires resident=True (the gradient stays on the device)')
        return resident, step_result

    def _adopt(self, state: dict) -> None:
        """Take a validated state as the trainer's own; any device session is dropped without export."""
        self._state = state
        metadata = {key: value for key, value in state["metadata"].items() if key != "numerics"}
        state["metadata"] = metadata if self._numerics == "identical" else {**metadata, "numerics": self._numerics}
        self._shape = LanguageModelConfig.from_dict(state["config"])
        self._model: DeviceModel | None = None
        self._gradient_ready = False
        self._lost = False

    @property
    def _device(self) -> engine.Device:
        return self._executor.devices[0]

    def _check_alive(self) -> None:
        if self._lost:
            raise refused("the device context was lost; the steps since the last export are gone. "
                          "Call load_state_dict() with a saved state to continue", ErrorCode.DEVICE_LOST)

    def _open(self) -> DeviceModel:
        """The device model, opened from the host state if no session is open."""
        if self._model is None:
            s, h = self._state, self._state["hyperparameters"]
            state = HostState(s["parameters"], s["m"], s["v"])
            adamw = AdamW(betas=h["betas"], eps=h["eps"], weight_decay=h["weight_decay"])
            plans = step_plans(self._numerics, self._resident)
            self._model = self._engine_call(lambda: DeviceModel(self._device, self._shape, state, adamw,
                                                                numerics=self._numerics, plans=plans))
        return self._model

    def _engine_call(self, call):
        """Run device work; an engine error (``kernels.device_work``) marks the context lost (the state on it
        is unknown). A refused argument or a failed allocation happens before anything changes, and passes
        through."""
        with device_work(self._device.name, self._mark_lost):
            return call()

    def _mark_lost(self) -> None:
        self._lost = True
        self._model = None

    def _sync_host(self) -> None:
        """Bring the resident state back into the host state."""
        if self._model is not None:
            self._state.update(self._engine_call(self._model.download_state).arrays())

    # ---- ids ------------------------------------------------------------------------------------------

    def _ids(self, ids, *, length: int, what: str, min_batch=1, max_batch=None) -> np.ndarray:
        array = np.asarray(ids)
        if array.ndim != 2:
            raise value_error(f"{what}: ids must be 2-D (batch, positions), got shape {array.shape}")
        if array.dtype.kind not in "iu":  # numpy's signed and unsigned integers (np.integer)
            raise value_error(f"{what}: ids must be integers, got {array.dtype}")
        batch, positions = array.shape
        if positions != length:
            raise value_error(f"{what}: ids must have {length} positions per row, got {positions}")
        if batch < min_batch or (max_batch is not None and batch > max_batch):
            raise value_error(f"{what}: batch must be in [{min_batch}, {max_batch}], got {batch}")
        if array.size and (array.min() < 0 or array.max() >= self._shape.vocab_size):
            raise value_error(f"{what}: ids must lie in [0, {self._shape.vocab_size}), "
                              f"got [{array.min()}, {array.max()}]")
        return array.astype(np.int32)

    def _train_ids(self, ids, what: str) -> np.ndarray:
        c = self._shape
        return self._ids(ids, length=c.length + 1, what=what, min_batch=c.batch, max_batch=c.batch)

    # ---- training -------------------------------------------------------------------------------------

    @serialised
    def train_step(self, ids) -> dict:
        """One step: mean cross-entropy of ids (batch, length + 1) and an AdamW update, applied whole or not
        at all (a non-finite loss or gradient refuses it)."""
        self._check_alive()
        ids = self._train_ids(ids, "train_step")
        model = self._open()
        step, lr = self._state["step"] + 1, self._state["hyperparameters"]["lr"]
        losses, problem = (self._replayed_step if model.plans != "off" else self._launched_step)(model, ids, step, lr)
        if problem is not None:
            self._gradient_ready = False
            self._close_if_stateless()
            raise refused(f"train_step: {problem}; the step was rolled back")
        result = {"loss": mean_loss(losses), "step": step, "completed_steps": step, "next_batch_index": step}
        if self._step_result == "full":
            flat = self._engine_call(model.gradients.numpy)
            result["flat_gradients"] = flat
            result["gradients"] = {k: v.copy() for k, v in split_parameters(flat, self._shape).items()}
        else:
            result["flags"] = {"resident": self._resident, "loss_finite": True}
        self._close_if_stateless()
        return result

    def _launched_step(self, model: DeviceModel, ids: np.ndarray, step: int, lr: float):
        """A step launched from Python: the losses, then the backward and the gradient check only if they are
        finite, then the update only if the gradient passes. Answers (losses, what refused the step or None)."""
        def run():
            buffers = model.forward(ids[:, :-1])
            return buffers, model.losses(buffers, ids[:, 1:], with_gradient=True)

        buffers, losses = self._engine_call(run)
        problem = self._loss_problem(losses)
        if problem is None:
            self._engine_call(lambda: model.backward(buffers, ids[:, :-1]))
            problem = self._engine_call(model.gradient_problem)
        if problem is None:
            with applied_whole():
                self._engine_call(lambda: model.adamw(step=step, lr=lr))
                self._complete(step)
        return losses, problem

    def _replayed_step(self, model: DeviceModel, ids: np.ndarray, step: int, lr: float):
        """A step replayed from its plan, update included (``DeviceModel.planned_step``): the device takes the
        update or skips it on its own verdict, read back with the losses; a refused step changed nothing, and the
        host names what was wrong (the losses, else the gradient check's sums, downloaded then). Answers (losses,
        what refused the step or None)."""
        with applied_whole():  # the update runs in the replay: it and the step count are applied whole
            losses, updated = self._engine_call(lambda: model.planned_step(ids, step=step, lr=lr))
            problem = None
            if not updated:
                problem = self._loss_problem(losses) or self._engine_call(model.summed_gradient_problem) or \
                    "the device refused the gradient, though the host finds it sound"
            if problem is None:
                self._complete(step)
        return losses, problem

    def _complete(self, step: int) -> None:
        self._state["step"] = step
        self._gradient_ready = True

    @staticmethod
    def _loss_problem(losses: np.ndarray) -> str | None:
        loss = mean_loss(losses)
        return None if math.isfinite(loss) else f"the loss is not finite ({loss})"

    def _close_if_stateless(self) -> None:
        if not self._resident and self._model is not None:
            self._sync_host()
            self._model = None

    @serialised
    def evaluate(self, ids) -> float:
        """Mean loss on ids (batch, length + 1) without changing any state."""
        self._check_alive()
        ids = self._train_ids(ids, "evaluate")
        model = self._open()
        losses = self._engine_call(lambda: model.losses(model.forward(ids[:, :-1]), ids[:, 1:],
                                                        with_gradient=False))
        self._close_if_stateless()
        return mean_loss(losses)

    @serialised
    def logits(self, ids, *, lengths=None) -> np.ndarray:
        """Float32 logits (batch, length, vocab) of every position; with lengths, padding positions are +0.0."""
        self._check_alive()
        c = self._shape
        array = np.asarray(ids)
        if array.ndim != 2:
            raise value_error(f"logits: ids must be 2-D (batch, length), got shape {array.shape}")
        batch, length = array.shape
        if not 1 <= length <= c.length:
            raise value_error(f"logits: length must be in [1, {c.length}], got {length}")
        if batch * length * c.vocab_size > LOGITS_MAX_CELLS:
            raise value_error(f"logits: batch·length·vocab = {batch * length * c.vocab_size} exceeds "
                              f"{LOGITS_MAX_CELLS}")
        ids = self._ids(array, length=length, what="logits", max_batch=LOGITS_MAX_BATCH)
        real = self._lengths(lengths, batch, length)
        model = self._open()
        out = self._engine_call(lambda: model.forward(ids).head.logits.numpy()).reshape(batch, length, c.vocab_size)
        self._close_if_stateless()
        # Causal attention and row-wise kernels make a real position's logits independent of what follows it,
        # so the row's padding cannot reach them; padding positions themselves answer +0.0.
        out[np.arange(length)[None, :] >= real[:, None]] = 0.0
        if not np.all(np.isfinite(out)):
            raise refused("logits: a logit is not finite")
        return out

    @staticmethod
    def _lengths(lengths, batch: int, length: int) -> np.ndarray:
        if lengths is None:
            return np.full(batch, length)
        real = np.asarray(lengths)
        if real.shape != (batch,) or not np.issubdtype(real.dtype, np.integer):
            raise value_error(f"lengths must be {batch} integers, got {real!r}")
        if real.min() < 1 or real.max() > length:
            raise value_error(f"lengths must lie in [1, {length}], got [{real.min()}, {real.max()}]")
        return real

    @serialised
    def next_bytes(self, ids, *, lengths=None) -> list[int]:
        """The greedy next id after each row (its last real position); ties go to the lowest id."""
        out = self.logits(ids, lengths=lengths)
        last = self._lengths(lengths, out.shape[0], out.shape[1]) - 1
        return [int(i) for i in np.argmax(out[np.arange(out.shape[0]), last], axis=-1)]

    # ---- state ----------------------------------------------------------------------------------------

    def _host_state(self) -> dict:
        """The trainer's own complete state on the host (downloads a resident session once); not a copy."""
        self._check_alive()
        self._sync_host()
        return self._state

    @serialised
    def export_state(self) -> dict:
        """The complete training state as fresh copies (downloads a resident session once)."""
        return ckpt.validate_state(self._host_state(), self._shape)

    @serialised
    def state_dict(self) -> dict:
        return self.export_state()

    @serialised
    def load_state_dict(self, state) -> None:
        """Replace the complete state, and take its numeric mode; validated first, so a refused state leaves the
        trainer untouched."""
        checked = ckpt.validate_state(state)
        self._numerics = run_numerics(state_numerics(checked), self._executor)
        self._adopt(checked)

    @serialised
    def export_gradients(self, named: bool = True) -> dict:
        """The pre-update gradient of the last completed step of a resident session."""
        self._check_alive()
        if not self._resident or self._model is None:
            raise refused("export_gradients: no resident session is open (train_step returns gradients "
                          "on the stateless path)")
        if not self._gradient_ready:
            raise refused("export_gradients: no step has completed since the session was opened, "
                          "restored or rolled back")
        flat = self._engine_call(self._model.gradients.numpy)
        out = {"flat_gradients": flat}
        if named:
            out["gradients"] = {k: v.copy() for k, v in split_parameters(flat, self._shape).items()}
        return out

    @serialised
    def close(self) -> None:
        """Copy the device state to the host and release the device; a later call re-opens it."""
        if self._lost:
            self._model = None
            return
        self._sync_host()
        self._model = None
        self._gradient_ready = False

    @property
    @serialised
    def step_(self) -> int:
        return self._state["step"]

    @property
    @serialised
    def parameters_(self) -> np.ndarray:
        self._check_alive()
        if self._model is not None:
            return self._engine_call(self._model.parameters.numpy)
        return self._state["parameters"].copy()

    @property
    @serialised
    def data_schedule(self) -> dict:
        return copy.deepcopy(self._state["data_schedule"])

    @staticmethod
    def parameter_registry(shape=None) -> list[dict]:
        return parameter_registry(shape)

    @serialised
    def run_metadata(self) -> dict:
        """Profile, configuration, schedule and binary details of this run (constants only)."""
        from .. import _build

        variant_dir = _build.VARIANTS_DIR / engine.ENGINE_VARIANT
        key_file = variant_dir / "build.key"
        return {
            "trainer": "uform.LanguageModelTrainer",
            "device": self._device.name,
            "resident": self._resident,
            "step_result": self._step_result,
            "numeric_mode": self._numerics,
            "config": self._shape.to_dict(),
            "n_total": self._shape.n_total,
            "hyperparameters": dict(self._state["hyperparameters"]),
            "completed_steps": self._state["step"],
            "data_schedule": self.data_schedule,
            "engine": {"variant": engine.ENGINE_VARIANT,
                       "build_key": key_file.read_text() if key_file.exists() else None},
        }

    @serialised
    def attention_stage_report(self) -> dict | None:
        """Memory held by the open session's attention stages (None without a resident session).

        The engine's attention never materialises score matrices (a team scores 64 × 64 pairs at a time in
        shared memory), so the eager cells are zero; what it keeps is one log-sum-exp per query and head,
        per layer."""
        if not self._resident or self._model is None:
            return None
        c = self._shape
        report = {"forward_eager_cells": 0, "forward_aexp_cells": 0, "backward_eager_cells": 0,
                  "forward_eager_bytes": 0, "forward_aexp_bytes": 0, "backward_eager_bytes": 0,
                  "eager_bytes": 0, "layers": c.layers, "per_layer": []}
        lse_cells = sum(n * c.heads for n in self._model.stack.token_counts())
        report["lse_bytes"] = 4 * lse_cells * c.layers
        report["total_bytes"] = report["lse_bytes"]
        report["per_layer"] = [{"layer": i, "path": "streaming", "lse_cells": lse_cells} for i in range(c.layers)]
        return report

    # ---- checkpoints ------------------------------------------------------------------------------------

    @serialised
    def export_checkpoint(self, path) -> None:
        """Write the complete state to path as a JSON checkpoint (atomic, at most 2 MiB)."""
        ckpt.write_json_checkpoint(path, self._host_state())  # the writer checks the state it writes

    save_checkpoint = export_checkpoint

    @serialised
    def export_checkpoint_binary(self, path) -> str:
        """Write the complete state as a binary checkpoint (atomic); returns the file's SHA-256."""
        return ckpt.write_binary_checkpoint(path, self._host_state())  # the writer checks it

    @classmethod
    def _from_state(cls, state: dict, resident, executor, numerics) -> LanguageModelTrainer:
        trainer = cls.__new__(cls)
        trainer._start(state, executor, resident, None, numerics)
        return trainer

    # numerics=None resumes in the checkpoint's numeric mode; "identical" or "fast" switches to that one.
    @classmethod
    def from_checkpoint(cls, path, *, resident=None, executor=None, numerics=None) -> LanguageModelTrainer:
        return cls._from_state(ckpt.read_json_checkpoint(path), resident, executor, numerics)

    @classmethod
    def from_checkpoint_bytes(cls, encoded, *, resident=None, executor=None, numerics=None) -> LanguageModelTrainer:
        if not isinstance(encoded, bytes):
            raise type_error(f"from_checkpoint_bytes takes exactly bytes, got {type(encoded).__name__}")
        return cls._from_state(ckpt.read_json_checkpoint_bytes(encoded), resident, executor, numerics)

    @classmethod
    def from_checkpoint_binary(cls, path, *, resident=None, executor=None, numerics=None) -> LanguageModelTrainer:
        return cls._from_state(ckpt.read_binary_checkpoint(path), resident, executor, numerics)


SmallByteLanguageModelTrainer = LanguageModelTrainer


def mean_loss(losses: np.ndarray) -> float:
    """The mean of per-position float32 losses, summed in float64."""
    return float(losses.sum(dtype=np.float64)) / losses.size


def state_numerics(state: dict) -> str:
    """The numeric mode a state was trained in: its metadata's "numerics", which only fast runs write."""
    return state["metadata"].get("numerics", "identical")


def state_sha256(state: dict) -> str:
    """SHA-256 over a state's parameters, m and v bytes (for comparing runs bit for bit)."""
    digest = hashlib.sha256()
    for name in ckpt.ARRAYS:
        digest.update(np.ascontiguousarray(state[name], "<f4").tobytes())
    return digest.hexdigest()

