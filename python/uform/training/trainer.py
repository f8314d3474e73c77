"""``uform.Trainer``: the multimodal training API of the seeds.

    trainer = uform.Trainer.init_vram(executor, depth=2, hidden=128, objective=uform.Objective.JOINT,
                                      batch=uform.BatchShape(max_rows_per_device=8, max_columns_per_row=256),
                                      schedule=uform.Schedule(steps=1000), seed=42)
    trainer.step([uform.Modality.TEXT] * 4, texts, relations=uform.Relations(attract=(offsets, ids)), stats=stats)
    trainer.save("checkpoint.safetensors")

A step checks every argument before anything runs (a refused step changes nothing), builds its batch on the host
(``uform.training.batch``: media decoded on the shared pool, items packed into rows, corrupted by draws keyed by
seed, step and item, relations resolved into pair targets), runs forward, losses and backward on every device of
the world (``uform.training.world``, docs/mesh.md: the same bits whatever the split) and applies AdamW whole, even
under Ctrl-C (``uform.training.update``). A step with no item to train on, or whose loss is not finite, is refused
before the update. Every public method holds the trainer's lock (``docs/guarantees.md``); ``trainer.on(executor)``
answers a receiver whose verbs block, ``trainer.deferred(executor)`` one whose verbs answer a ``Deferred`` at once
(``uform.training.deferred``). ``close()`` stops the trainer's threads.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..errors import ErrorCode, UFormError, UFormRuntimeError
from ..executor import Executor
from ..kernels import device_work
from ..mesh import Mesh
from ..nn.resident import named_tensors
from . import checkpoint
from .arena import Arena
from .batch import step_batch
from .config import BatchShape, Choices, Contrastive, LateInteraction, Masking, Schedule
from .deferred import DeferredOn, On, Prefetch, ready
from .encoder import EncoderModel, StepBatch
from .enums import LateInteractionSide, Modality, Objective, Scalar
from .media_step import MEDIA_KINDS, PendingMedia, PreparedMedia
from .packing import Packed
from .reading import choice_probabilities, pooled_embeddings, token_vectors
from .relations import Relations
from .stats import TrainerStepStats
from .step_inputs import StepInputs, check_choose_inputs, check_step_inputs
from .tapes import RowsTape
from .start import start_run
from .update import apply_update
from .world import GradientReducer, World, on_host_domain_0, tell_refusal, world_inputs, world_run, world_step

class Trainer:
    """A training run on the device of the executor it was created on."""

    def __init__(self, *, executor: Executor, mesh: Mesh | None, world: World, run, seed: int,
                 replicas: list[EncoderModel], step: int):
        self._executor = executor
        self._mesh = mesh
        self._world = world
        self._run = run
        self._seed = seed
        self._replicas = replicas  # one per device of the executor, identical after every step
        self._model = replicas[0]
        self._reduce_gradients = GradientReducer(world, replicas, replicas[0].registry)
        self._step = step
        self._dropped_unread = 0
        self._lock = threading.Lock()
        self._lost = False
        self._worker: ThreadPoolExecutor | None = None
        self._prefetch = Prefetch(self)  # deferred steps' decoding and packing done ahead

    # ---- creation ------------------------------------------------------------------------------------

    @classmethod
    def init_vram(cls, executor: Executor, /, *, mesh=None, resume=None, depth: int = 0, hidden: int = 0,
                  batch: BatchShape | None = None, objective: Objective = Objective.MASKED,
                  masking: Masking | None = None, contrastive: Contrastive | None = None,
                  late_interaction: LateInteraction | None = None, choices: Choices | None = None,
                  schedule: Schedule | None = None, seed: int = 0, progress=None, progress_steps: int = 0,
                  training: bool = True, numerics: str | None = None) -> Trainer:
        """Build the replica on the executor's device and start, or resume from `resume`, the run.
        training=False keeps the parameters alone on the device (no gradient, no AdamW moments, a third
        of the memory): a replica that only embeds (``encode``, ``uform.Encoder``); it refuses step and
        save. numerics: "identical" or "fast" (docs/numerics.md); None: a resumed run keeps its checkpoint's
        mode, a new one takes the process mode (``uform.numeric_mode()``)."""
        world, run, replicas, step = start_run(
            executor, mesh, resume, dict(depth=depth, hidden=hidden, batch=batch, objective=objective, masking=masking,
                                         contrastive=contrastive, late_interaction=late_interaction, choices=choices,
                                         schedule=schedule),
            seed=seed, progress=progress, progress_steps=progress_steps, training=training, numerics=numerics)
        return cls(executor=executor, mesh=mesh, world=world, run=run, seed=int(seed), replicas=replicas, step=step)

    @contextlib.contextmanager
    def _device_call(self):
        """Hold the trainer's lock over a call that works on the device. An error of the engine itself (not
        a refusal, not a failed allocation) leaves the device state unknown: it raises DEVICE_LOST, and so
        does every later call (resume from a checkpoint to go on)."""
        with self._lock:
            if self._lost:
                raise UFormRuntimeError(ErrorCode.DEVICE_LOST, "the device failed in an earlier call, so its state "
                                        "is unknown; resume from a checkpoint")
            with device_work(self._executor.devices[0].name, lambda: setattr(self, "_lost", True)):
                yield

    # ---- receivers ----------------------------------------------------------------------------------------

    def _check_executor(self, executor: Executor) -> None:
        if executor is not self._executor:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, "executor: a trainer's verbs run on the executor it was "
                                                         "made on")

    def on(self, executor: Executor, /) -> On:
        """A receiver whose verbs block on `executor` (the one the trainer was made on)."""
        self._check_executor(executor)
        return On(self)

    def deferred(self, executor: Executor, /) -> DeferredOn:
        """A receiver whose verbs submit to `executor` and answer a Deferred at once."""
        self._check_executor(executor)
        with self._lock:
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="uform-trainer")
            return DeferredOn(self, self._worker)

    # ---- facts ----------------------------------------------------------------------------------------------

    @property
    def completed_steps(self) -> int:
        """Optimizer steps applied, across resumes."""
        return self._step

    @property
    def mesh(self) -> Mesh | None:
        """The mesh the run spans (the trainer borrows it), or None for a process alone."""
        return self._mesh

    @property
    def run(self):
        """The validated run, every field derived."""
        return self._run

    @property
    def numerics(self) -> str:
        """The run's numeric mode: "identical" or "fast" (docs/numerics.md)."""
        return self._model.numerics

    @property
    def model(self) -> EncoderModel:
        """The engine-side model (parameters, gradient and moments on the device), for inspection."""
        return self._model

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter tensor by name (a download)."""
        with self._device_call():
            return named_tensors(self._model.parameters.numpy(), self._model.registry)

    # ---- the step ---------------------------------------------------------------------------------------------

    def _checked_inputs(self, modalities, contents, *, bags=None, temperature_groups=None, sides=None, choices=None,
                        choice_targets=None, relations: Relations | None = None, outputs_scalar: Scalar = Scalar.F32,
                        devices: int | None = None, **_) -> StepInputs:
        """A step's items and options checked against the run (UFormError naming what is wrong), for a batch over
        `devices` of this process (default: all of them)."""
        run = self._run
        return check_step_inputs(
            modalities, contents, bags=bags, temperature_groups=temperature_groups, sides=sides, choices=choices,
            choice_targets=choice_targets, relations=relations,
            temperature_group_count=run.contrastive.temperature_groups,
            max_edges_per_device=run.contrastive.max_edges_per_device * (devices or self._world.local),
            max_choices_per_item=run.batch.max_choices_per_item, outputs_scalar=outputs_scalar,
            modalities_enabled=self._modalities_enabled())

    def step(self, modalities, contents, /, *, bags=None, temperature_groups=None, sides=None, choices=None,
             choice_targets=None, relations: Relations | None = None, arena: Arena | None = None,
             outputs_scalar: Scalar = Scalar.F32, stats: TrainerStepStats | None = None,
             _decoded: PendingMedia | None = None, _prepared: Future | None = None):
        """Apply one optimizer step over these items; answers the pooled embeddings in `arena`, or None.
        (`_decoded`, `_prepared`: the media items and the batch the deferred receiver prepared ahead.)"""
        self._require_training("step")
        if stats is not None and not isinstance(stats, TrainerStepStats):
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"stats: a uform.TrainerStepStats or None, got "
                                                         f"{type(stats).__name__}")
        with self._device_call():
            if stats is not None:
                stats.reset()
            run, world = self._run, self._world
            if _prepared is not None:
                self._prefetch.run_queued(until=_prepared)
            prepared = ready(_prepared, self._step + 1)
            try:
                inputs = prepared.inputs if prepared is not None else self._checked_inputs(
                    modalities, contents, bags=bags, temperature_groups=temperature_groups, sides=sides,
                    choices=choices, choice_targets=choice_targets, relations=relations,
                    outputs_scalar=outputs_scalar)
                if arena is not None and not isinstance(arena, Arena):
                    raise UFormError(ErrorCode.INVALID_ARGUMENT, f"arena: expected uform.Arena, got "
                                                                 f"{type(arena).__name__}")
            except Exception as refusal:
                tell_refusal(world, refusal)
                raise
            step = self._step + 1
            inputs_here = inputs
            inputs, first_item, bags_given = world_inputs(world, inputs, bags is not None)
            batch, packed = (prepared.batch, prepared.packed) if prepared is not None else \
                self.step_batch(inputs, bags_given, step, decoded=_decoded, devices=world.size)
            if not packed.item_of_segment.size:
                raise UFormError(ErrorCode.INVALID_ARGUMENT, f"contents: no item to train on ({len(inputs.contents)} "
                                 f"given, {packed.dropped} dropped whole for lack of room); nothing was updated")
            want_pooled = arena is not None and run.objective != Objective.MASKED
            losses = world_step(world, run, self._replicas, batch, packed, want_pooled=want_pooled,
                                media_weights=self._media_weights(), while_queued=self._prefetch.run_queued)
            if not np.isfinite(losses.total):
                raise UFormError(ErrorCode.INVALID_ARGUMENT, f"step {step}: the loss is not finite "
                                 f"({losses.total}); nothing was updated")
            rate = apply_update(self._replicas, run, step, self._reduce_gradients,
                                commit=lambda: setattr(self, "_step", step))
            self._dropped_unread += packed.dropped
            if stats is not None:
                media_truncated = batch.media.truncated if batch.media is not None else 0
                stats.record(step, rate, losses, packed.truncated + media_truncated, self._dropped_unread)
                self._dropped_unread = 0
            if not want_pooled:
                return None
            rows = np.zeros((len(inputs.contents), run.hidden), np.float32)
            rows[packed.item_of_segment] = losses.pooled
            return arena.land(rows[first_item:first_item + len(inputs_here.contents)], inputs_here.outputs_scalar)

    def evaluate(self, modalities, contents, /, *, relations: Relations | None = None, temperature_groups=None,
                 sides=None, choices=None, choice_targets=None, corrupt_as_step: int | None = None) -> dict:
        """The step's losses without any update, plus the unit-norm pooled embeddings of every item and the
        masked-byte accuracy at covered positions (corrupted as step `corrupt_as_step` would be, by default
        the next one). Dropped items' embeddings are zero rows."""
        with self._device_call():
            run = self._run
            inputs = self._checked_inputs(modalities, contents, relations=relations,
                                          temperature_groups=temperature_groups, sides=sides, choices=choices,
                                          choice_targets=choice_targets, devices=1)  # one device's batch
            step = self._step + 1 if corrupt_as_step is None else corrupt_as_step
            batch, packed = self.step_batch(inputs, False, step)
            contrastive = run.objective != Objective.MASKED
            losses = self._model.step_losses(batch, text_weight=run.masking.text_weight, with_gradient=False,
                                             want_pooled=contrastive, media_weights=self._media_weights(),
                                             late_weight=run.late_interaction.weight,
                                             choices_weight=run.choices.weight)
            result = {"loss": losses.total, "masked_text_loss": losses.masked,
                      "contrastive_loss": losses.contrastive, "late_interaction_loss": losses.late_interaction,
                      "choices_loss": losses.choices,
                      **{f"masked_{name}_loss": loss for name, loss in losses.reconstruction.items()}}
            if contrastive:
                embeddings = np.zeros((len(inputs.contents), run.hidden), np.float32)
                embeddings[packed.item_of_segment] = losses.pooled
                result["embeddings"] = embeddings
            if run.objective != Objective.CONTRASTIVE and batch.covered:
                covered = batch.targets.reshape(-1) >= 0
                predicted = self._model.masked_predictions()[covered]
                result["masked_accuracy"] = float(np.mean(predicted == batch.targets.reshape(-1)[covered]))
            return result

    def _modalities_enabled(self) -> frozenset:
        return frozenset({Modality.TEXT} | {kind.modality for kind in MEDIA_KINDS if kind.width(self._run.batch)})

    def _media_weights(self) -> dict[str, float]:
        return {kind.name: kind.weight(self._run.masking) for kind in MEDIA_KINDS}

    def _require_training(self, verb: str) -> None:
        if not self._model.training:
            raise UFormError(ErrorCode.UNSUPPORTED, f"{verb}: this replica was made with training=False (parameters "
                                                    "alone, for embedding); make it with training=True to train")

    def close(self) -> None:
        """Stop the trainer's thread: the deferred receivers' worker (after the calls it holds). The trainer takes no
        call after it. (Media items decode on ``uform.media.shared_pool()``, which every trainer shares.)"""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.shutdown(wait=True)  # outside the lock: the calls it still holds take the lock
        self._prefetch.close()

    def encode(self, modalities, contents, /, *, width: int | None = None) -> np.ndarray:
        """The unit-norm embeddings (items, width) float32 of the items as given, uncorrupted: each item's
        mean final state, its first `width` dimensions (a Matryoshka prefix; default the whole hidden
        width) L2-normalised. Any number of items: they are packed a batch at a time into the run's batch
        shape, so an item's embedding is the same alone or among others, wherever it lands. An item longer
        than a row is cut to a row, as in a step."""
        with self._device_call():
            run = self._run
            width = run.hidden if width is None else width
            if not isinstance(width, (int, np.integer)) or not 0 < width <= run.hidden:
                raise UFormError(ErrorCode.INVALID_ARGUMENT, f"width: must be an integer in [1, {run.hidden}], "
                                                             f"got {width!r}")
            inputs = check_step_inputs(modalities, contents, modalities_enabled=self._modalities_enabled())
            return pooled_embeddings(self._model, run, self._seed, inputs, int(width))

    def text_choose(self, texts, choices, /) -> RowsTape:
        """The model's distribution over each text's legal bytes (``choices``, as a step takes them) at the
        position after the text: the masked head at an appended MASK, its softmax over those bytes alone.
        Answers a float32 RowsTape shaped as `choices` (an item offering none gets an empty entry), so
        ``(probabilities, probabilities.offsets)`` feeds a step's ``choice_targets``. Any number of texts,
        packed a batch at a time, uncorrupted; a text longer than a row keeps its last bytes."""
        with self._device_call():
            if self._run.objective == Objective.CONTRASTIVE:
                raise UFormError(ErrorCode.UNSUPPORTED, "text_choose: a CONTRASTIVE run has no masked head to "
                                                        "choose with")
            inputs = check_choose_inputs(texts, choices)
            return RowsTape(choice_probabilities(self._model, self._run, self._seed, inputs), inputs.choice_offsets)

    def encode_tokens(self, modalities, contents, /, *, side=LateInteractionSide.DOCUMENT) -> list[np.ndarray]:
        """The unit token vectors the late-interaction loss scores, uncorrupted: per item a float32 (rows, width)
        array, its every position for a DOCUMENT, its first ``max_query_span`` for a QUERY. Score a query
        against documents with ``uform.maxsim``. An item's vectors are the same alone or among others."""
        with self._device_call():
            run = self._run
            if run.late_interaction.weight <= 0:
                raise UFormError(ErrorCode.UNSUPPORTED, "encode_tokens: the run trains no token head "
                                                        "(late_interaction.weight is 0)")
            if side not in (LateInteractionSide.QUERY, LateInteractionSide.DOCUMENT):
                raise UFormError(ErrorCode.INVALID_ARGUMENT, f"side: QUERY or DOCUMENT, got {side!r}")
            inputs = check_step_inputs(modalities, contents, modalities_enabled=self._modalities_enabled())
            return token_vectors(self._model, run, self._seed, inputs, side)

    def step_batch(self, inputs: StepInputs, bags_given: bool, step: int, corrupted: bool = True,
                   decoded: PendingMedia | PreparedMedia | None = None, train_choices: bool | None = None,
                   devices: int = 1) -> tuple[StepBatch, Packed]:
        """``uform.training.batch.step_batch`` for this trainer's run and seed."""
        return step_batch(self._run, self._seed, inputs, bags_given, step, corrupted, decoded, train_choices, devices)

    # ---- save ----------------------------------------------------------------------------------------------------

    def save(self, path, /, *, progress=None, progress_steps: int = 0) -> bool:
        """Write weights, AdamW moments, temperatures, step and run to a safetensors file (atomically, with a
        SHA-256 per tensor); answers True, or False when the progress callback stopped it (no file written,
        an existing one untouched). In a mesh every process calls it and host domain 0 alone writes (its own
        path and progress); the others wait for it and answer what it answered, or raise what it raised."""
        self._require_training("save")
        with self._device_call():
            world = self._world

            def write() -> bool:
                return checkpoint.write(
                    os.fsencode(path) if isinstance(path, str) else path, self._model.registry,
                    self._model.download_state(), step=self._step, seed=self._seed,
                    run=checkpoint.run_json(world_run(self._run, world.size)), numerics=self._model.numerics,
                    progress=progress, progress_steps=progress_steps)

            return on_host_domain_0(world, write, "save")
