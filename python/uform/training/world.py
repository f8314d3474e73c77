"""A trainer's world: every device of the run, across this process's executor and the mesh's processes.

A step of a world of W devices, each holding R rows, runs as one device would over W·R rows
(docs/mesh.md, "Identical across splits"):

1. Every process's checked items are exchanged (``gather_inputs``), and the world's items are every
   process's in host-domain order (``concatenate_inputs``). Each process packs, corrupts and resolves them
   the same way, as one grid of W·R rows in blocks of R (a bag stays in one block), and keeps its devices'
   blocks (``device_batch``).
2. Each device runs its step's first phase (``EncoderModel.step_phases``); every segment's pooled state is
   gathered in world order (``world_pooled``).
3. Each device runs the contrastive head over the world's segments and the backward, then the masked loss is
   summed exactly over the world's positions (``world_masked_loss``). Every sum over
   tokens took one partial per packed row and combined them by the row tree, so a device's gradient is a
   subtree's sum; ``GradientReducer`` adds the devices' gradients in the same tree (this process's devices,
   then the processes'), giving one device's bits; tensors every device computed whole from the world (the
   contrastive temperatures) are taken once. A process of one GPU in an NCCL mesh gathers the gradients on
   the device and adds them there (``kernels.tree_sum``); CPU processes and processes of several devices add
   them on the host (``row_tree``, the same order).

A process without a mesh whose executor has one device skips every exchange; with a mesh, even of one
process, the exchanges run through its collectives (so a world of one exercises them, to the same bits).
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass, fields, is_dataclass, replace

import numpy as np

from .. import kernels as K
from ..mesh import Mesh
from ..mesh.collectives import Collectives
from ..nn.transformer import StackGeometry, world_block_rows
from .encoder import LocalOutputs, StepBatch, WorldOutputs, finish_phases, masked_mean
from .enums import Modality
from ..errors import ErrorCode, UFormError
from .relations import EDGE_SETS, Edges, Relations
from .step_inputs import StepInputs

REPLICATED = ("temperature.log_scale", "temperature.bias")
"""Gradient tensors every device computes whole from the world's segments: taken from one device, not summed."""


@dataclass(frozen=True)
class World:
    """This process's place in the run: `size` devices in all, its `local` ones from world index `first`, and
    the collectives joining the processes (None without a mesh)."""

    size: int
    first: int
    local: int
    collectives: Collectives | None

    @classmethod
    def of(cls, executor, mesh: Mesh | None) -> World:
        local = len(executor.devices)
        if mesh is None:
            return cls(size=local, first=0, local=local, collectives=None)
        description = mesh.describe()
        return cls(size=description.world_size, first=description.first_rank, local=local,
                   collectives=mesh.collectives)

    @property
    def processes(self) -> int:
        return 1 if self.collectives is None else self.collectives.size

    @property
    def rank(self) -> int:
        return 0 if self.collectives is None else self.collectives.rank


def row_tree(parts: list[np.ndarray]) -> np.ndarray:
    """The row tree (engine.reduction.tree_reduce) over float32 arrays on the host: T(0..n) = T(0..m) + T(m..n),
    m the largest power of two below n. numpy adds float32 as the engine does (IEEE, rounded to nearest)."""
    if len(parts) == 1:
        return parts[0]
    half = 1 << ((len(parts) - 1).bit_length() - 1)
    return np.add(row_tree(parts[:half]), row_tree(parts[half:]), dtype=np.float32)


def world_run(run, size: int):
    """The run as a world of `size` devices sees it: every cap named per device (a field ending in
    ``_per_device``, in the batch and the heads' settings) times the devices. What a checkpoint records, so the
    runs of one world batch on any split write the same file, and one resumes on any of them."""
    if size == 1:
        return run

    def scaled(settings):
        return replace(settings, **{f.name: getattr(settings, f.name) * size for f in fields(settings)
                                    if f.name.endswith("_per_device")})

    return replace(run, **{f.name: scaled(getattr(run, f.name)) for f in fields(run)
                           if is_dataclass(getattr(run, f.name))})


def check_world(run, world: World, numerics: str, geometry: StackGeometry) -> None:
    """Refuse a world of several devices the split-independent step does not cover yet (docs/mesh.md); numerics:
    the run's mode, resolved (a resumed run's from its checkpoint); geometry: the encoder's stack, whose weight
    gradients' exact blocks (world_block_rows) a device must hold whole."""
    if world.size == 1:
        return
    where = f"a world of {world.size} devices"
    if numerics == "fast":
        raise UFormError(ErrorCode.UNSUPPORTED, f"numerics: fast mode's reductions depend on the split; {where} "
                                                "trains in identical mode")
    unsupported = [name for name, on in (
        ("late_interaction.weight", run.late_interaction.weight > 0), ("choices.weight", run.choices.weight > 0),
        ("batch.max_choices_per_item", run.batch.max_choices_per_item > 0),
        ("batch.image", run.batch.image.patch_side > 0), ("batch.video", run.batch.video.patch_side > 0),
        ("batch.audio", run.batch.audio.chunk_samples > 0)) if on]
    if unsupported:
        raise UFormError(ErrorCode.UNSUPPORTED, f"{', '.join(unsupported)}: {where} trains text with the masked and "
                                                "contrastive heads; media, late interaction and choices run on "
                                                "one device until their sums are split-independent")
    rows = run.batch.max_rows_per_device
    if rows & (rows - 1):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"batch.max_rows_per_device: {where} needs a power of two (a "
                                                     f"device's rows are one block of the row tree), got {rows}")
    columns = run.batch.max_columns_per_row
    block = world_block_rows(geometry, columns)
    if rows < block:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"batch.max_rows_per_device: {where} needs at least {block} "
                                                     f"(hidden {run.hidden}: the weight gradients are exact products "
                                                     f"over blocks of {block} rows of {columns} tokens, which a "
                                                     f"device holds whole), got {rows}")
    if world.processes > 1 and world.local & (world.local - 1):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"executor: {world.local} devices per process; a mesh of "
                                                     "several processes needs a power of two")


# ---- the items, exchanged ------------------------------------------------------------------------------------

def encode_inputs(inputs: StepInputs | UFormError) -> bytes:
    """A process's checked text items (or its refusal) as bytes for the exchange: numpy arrays in an .npz."""
    if isinstance(inputs, UFormError):
        arrays = {"refusal": np.frombuffer(json.dumps([int(inputs.code), inputs.message]).encode(), np.uint8)}
    else:
        lengths = np.fromiter(map(len, inputs.contents), np.int64, count=len(inputs.contents))
        arrays = {"content": np.frombuffer(b"".join(inputs.contents), np.uint8), "lengths": lengths,
                  "bags": inputs.bags, "temperature_groups": inputs.temperature_groups}
        for name in EDGE_SETS:
            edges = getattr(inputs.relations, name) if inputs.relations is not None else None
            if edges is not None and edges.offsets.size:
                arrays[f"{name}.offsets"], arrays[f"{name}.ids"] = edges.offsets, edges.ids
                if edges.weights is not None:
                    arrays[f"{name}.weights"] = edges.weights
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def decode_inputs(data: bytes) -> tuple[dict[str, np.ndarray], str | None]:
    """(arrays, refusal message or None) of ``encode_inputs``' bytes."""
    with np.load(io.BytesIO(data), allow_pickle=False) as stored:
        arrays = {name: stored[name] for name in stored.files}
    if "refusal" in arrays:
        code, message = json.loads(arrays["refusal"].tobytes())
        return arrays, f"{ErrorCode(code).name}: {message}"
    return arrays, None


def gather_inputs(world: World, inputs: StepInputs | UFormError) -> list[dict[str, np.ndarray]]:
    """Every process's items as arrays, in host-domain order; raises if any process refused its own (each
    process its own error, the others INVALID_ARGUMENT naming it), before anything changes."""
    gathered = [decode_inputs(data) for data in world.collectives.all_gather_bytes(encode_inputs(inputs))]
    if isinstance(inputs, UFormError):
        raise inputs
    for rank, (_, refusal) in enumerate(gathered):
        if refusal is not None:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"host domain {rank} refused its step's items ({refusal}); "
                                                         "nothing was updated")
    return [arrays for arrays, _ in gathered]


def tell_refusal(world: World, refusal: Exception) -> None:
    """Tell every process of the mesh that this one refused its step's items (each raises, none waits for the
    step); nothing for a process alone."""
    if world.collectives is None:
        return
    told = refusal if isinstance(refusal, UFormError) else \
        UFormError(ErrorCode.INVALID_ARGUMENT, f"{type(refusal).__name__}: {refusal}")
    with contextlib.suppress(UFormError):
        gather_inputs(world, told)


def world_inputs(world: World, inputs: StepInputs, bags_given: bool) -> tuple[StepInputs, int, bool]:
    """(the world's items, the index of this process's first item among them, whether bags are given): every
    process's checked items joined in host-domain order, which always give bags; a process alone's own."""
    if world.collectives is None:
        return inputs, 0, bags_given
    parts = gather_inputs(world, inputs)
    first_item = sum(part["lengths"].size for part in parts[:world.rank])
    return concatenate_inputs(parts, inputs.outputs_scalar), first_item, True


def concatenate_inputs(parts: list[dict[str, np.ndarray]], outputs_scalar) -> StepInputs:
    """The world's items: every process's in host-domain order, its bags and relations renumbered into the
    world's (a process's bag b becomes a bag of its own; edges shift by the items before it). Text items alone:
    a world of several devices refuses the rest at init (``check_world``)."""
    contents, bags, groups, edges = [], [], [], {name: ([], [], []) for name in EDGE_SETS}
    first_item, first_bag = 0, 0
    for arrays in parts:
        lengths = arrays["lengths"]
        ends = np.cumsum(lengths)
        data = arrays["content"].tobytes()
        contents += [data[end - length:end] for end, length in zip(ends.tolist(), lengths.tolist())]
        _, local_bags = np.unique(arrays["bags"], return_inverse=True)
        bags.append(local_bags.astype(np.int64) + first_bag)
        groups.append(arrays["temperature_groups"])
        count = lengths.size
        for name in EDGE_SETS:
            offsets, ids, weights = edges[name]
            if f"{name}.offsets" in arrays:
                part_offsets = arrays[f"{name}.offsets"].astype(np.int64)
                part_ids = arrays[f"{name}.ids"].astype(np.int64)
                part_weights = arrays.get(f"{name}.weights", np.ones(part_ids.size, np.float32))
            else:
                part_offsets, part_ids, part_weights = np.zeros(count + 1, np.int64), np.empty(0, np.int64), \
                    np.empty(0, np.float32)
            base = sum(i.size for i in ids)
            offsets.append(part_offsets[:-1] + base)
            ids.append(part_ids + first_item)
            weights.append(part_weights)
        first_item += count
        first_bag += int(local_bags.max(initial=-1)) + 1
    relations = {}
    for name, (offsets, ids, weights) in edges.items():
        total = sum(i.size for i in ids)
        if total:
            relations[name] = Edges(offsets=np.concatenate([*offsets, [total]]).astype(np.uint64),
                                    ids=np.concatenate(ids).astype(np.uint32), weights=np.concatenate(weights))
    items = len(contents)
    return StepInputs(modalities=np.full(items, int(Modality.TEXT), np.int32), contents=contents,
                      bags=np.concatenate(bags).astype(np.uint32), temperature_groups=np.concatenate(groups),
                      sides=np.zeros(items, np.int32), choice_offsets=np.zeros(items + 1, np.uint64),
                      choice_bytes=np.empty(0, np.uint8), choice_targets=np.empty(0, np.float32),
                      relations=Relations(**relations) if relations else None, outputs_scalar=outputs_scalar)


# ---- a device's rows of the world's batch ----------------------------------------------------------------------

def device_batch(batch: StepBatch, packed, device: int, rows: int) -> StepBatch:
    """Device `device`'s block of `rows` rows of the world's packed batch: its positions, its own segments (their
    starts within the block, their world indices) and the world's pair targets and lengths."""
    block = slice(device * rows, (device + 1) * rows)
    columns = batch.tokens.shape[1]
    own = np.flatnonzero((packed.segment_row >= block.start) & (packed.segment_row < block.stop))
    return replace(batch, tokens=batch.tokens[block], targets=batch.targets[block], positions=batch.positions[block],
                   token_segments=batch.token_segments[block], pooled_segments=batch.pooled_segments[block],
                   segment_starts=((packed.segment_row[own] - block.start) * columns
                                   + packed.segment_start[own]).astype(np.int32),
                   segment_lengths=batch.segment_lengths[own], world_segments=own.astype(np.int32),
                   world_lengths=batch.segment_lengths)


def world_pooled(world: World, locals_: list[LocalOutputs], batches: list[StepBatch], owners: np.ndarray,
                 hidden: int) -> WorldOutputs:
    """The world's pooled states (every segment's, in world order) from this process's devices' and, in a mesh,
    every process's (`owners`: the process whose devices hold each segment); None where nothing was exchanged
    (a device alone pools its own in place)."""
    if locals_[0].pooled is None:
        return WorldOutputs(pooled=None)
    pooled = np.zeros((batches[0].world_segment_count, hidden), np.float32)
    for local, batch in zip(locals_, batches):
        pooled[batch.world_segments] = local.pooled
    if world.collectives is not None:
        pooled = world.collectives.all_gather(pooled)[owners, np.arange(pooled.shape[0])]
    return WorldOutputs(pooled=pooled)


def world_masked_loss(world: World, losses: list[np.ndarray | None], covered: int) -> float:
    """The world's masked loss from this process's devices' per-position losses and, in a mesh, every
    process's (0 without the masked head)."""
    if losses[0] is None:
        return 0.0
    stacked = np.stack(losses)
    if world.collectives is not None:
        stacked = world.collectives.all_gather(stacked)
    return masked_mean(list(stacked.reshape(-1, stacked.shape[-1])), covered)


def world_step(world: World, run, replicas, batch: StepBatch, packed, *, want_pooled: bool,
               media_weights: dict[str, float], while_queued):
    """Forward, losses and backward of the world's packed batch on every device of this process (`replicas`), each
    over its block of rows, the world's pooled states and masked loss exchanged between the phases; answers the
    losses (every device's are the same). `while_queued()` runs once every device's step is queued, before any
    loss is read back: the trainer packs the next deferred steps' batches there, while this one runs."""
    rows = run.batch.max_rows_per_device
    alone = world.size == 1 and world.collectives is None
    batches = [batch] if world.size == 1 else \
        [device_batch(batch, packed, world.first + d, rows) for d in range(world.local)]
    phases = [replica.step_phases(device_batch_, exchange=not alone, text_weight=run.masking.text_weight,
                                  with_gradient=True, want_pooled=want_pooled, media_weights=media_weights,
                                  late_weight=run.late_interaction.weight, choices_weight=run.choices.weight)
              for replica, device_batch_ in zip(replicas, batches)]
    pooled = world_pooled(world, [next(phase) for phase in phases], batches,
                          packed.segment_row // (rows * world.local), run.hidden)
    for phase in phases:
        phase.send(pooled)  # QUEUED
    while_queued()
    masked = world_masked_loss(world, [next(phase) for phase in phases], batch.covered)
    return [finish_phases(phase, masked) for phase in phases][0]


def on_host_domain_0(world: World, write, verb: str):
    """``write()`` on host domain 0 alone, its answer (or its refusal) broadcast to every process of a mesh: each
    answers what it answered, or raises what it raised (``"{verb}: host domain 0 could not write: ..."`` on the
    others)."""
    answer, refusal = None, None
    if world.rank == 0:
        try:
            answer = json.dumps({"written": write()})
        except UFormError as error:
            answer, refusal = json.dumps({"code": int(error.code), "message": error.message}), error
    if world.processes > 1:
        answer = world.collectives.broadcast_bytes(answer.encode() if world.rank == 0 else None).decode()
    if refusal is not None:
        raise refusal
    outcome = json.loads(answer)
    if "code" in outcome:
        raise UFormError(ErrorCode(outcome["code"]), f"{verb}: host domain 0 could not write: {outcome['message']}")
    return outcome["written"]


class GradientReducer:
    """Makes every replica's gradient the world's after the backward: the devices' gradients added in the row tree
    (this process's devices, then the processes'), the REPLICATED tensors taken from the first device."""

    def __init__(self, world: World, replicas, registry: list[dict]):
        self.world, self.replicas = world, replicas
        self.replicated = [(entry["offset"], entry["size"]) for entry in registry if entry["name"] in REPLICATED]
        self.on_device = world.local == 1 and hasattr(world.collectives, "all_gather_device")
        self._gathered = None  # (processes, parameters) on the device, made at the first step

    def __call__(self) -> None:
        world = self.world
        if world.size == 1 and not self.on_device:  # alone (an NCCL world of one still runs its gather)
            return
        if self.on_device:
            self._reduce_on_device()
            return
        parts = [replica.gradients.numpy() for replica in self.replicas]
        total = row_tree(parts)
        if world.collectives is not None:
            total = row_tree(list(world.collectives.all_gather(total)))
        total = total.copy() if total is parts[0] else total
        for offset, size in self.replicated:
            total[offset:offset + size] = parts[0][offset:offset + size]
        for replica in self.replicas:
            replica.gradients.write(total)

    def _reduce_on_device(self) -> None:
        """One GPU per process (NCCL): every process's gradient gathered into (processes, parameters) on the
        device, then added in the row tree by the engine; the replicated tensors copied from process 0's row."""
        gradients = self.replicas[0].gradients
        if self._gathered is None:
            self._gathered = gradients.device.empty((self.world.processes, gradients.size))
        self.world.collectives.all_gather_device(gradients, self._gathered)
        K.tree_sum(gradients, self._gathered, self.world.processes)
        for offset, size in self.replicated:
            K.tree_sum(gradients.view(offset, size), self._gathered.view(offset, size), 1)
