"""Checking one step's inputs before anything runs, and normalising them to numpy.

``Trainer.step`` takes each item's modality and content plus optional per-item
arrays. :func:`check_step_inputs` refuses what the engine cannot take, naming
the array and the item at fault:

- ``SHAPE_MISMATCH``: a per-item array (``modalities``, ``bags``,
  ``temperature_groups``, ``sides``, ``choices``, ``choice_targets``, a relations
  offsets array) whose length disagrees with ``contents``, or an item's targets
  not as many as its choices.
- ``INVALID_ARGUMENT``: everything else -- a modality or side that names no
  enumerator, an item of a media modality the run's batch shape leaves out
  ("item 2: IMAGE items need batch.image with a positive patch_side"), text
  content that is neither bytes nor str, an empty text (it would pool
  zero positions), a temperature group at or past the run's count, an item
  offering more choices than the batch allows or one byte twice, targets that are
  negative or do not sum to one within 1e-5, choices offered by an item that is not text,
  ``choice_targets`` without ``choices`` or the reverse, and every relations error
  :func:`check_relations` names.

An empty per-item array means its default, as the seed says: every item its own
bag, every item in temperature group zero, every side ``NONE``, no choices.
Choices are read when the run trains them; an item offering none makes no
choice, and its targets entry is empty.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .arrays import first_not_finite_non_negative, per_item
from .enums import LateInteractionSide, Modality, Scalar
from ..errors import ErrorCode, UFormError
from .relations import Relations, check_relations, edge_owners
from .tapes import as_float_entries, as_text, as_texts, entries, tape_entries

CHOICE_TARGET_TOLERANCE = 1e-5
"""How far an item's choice targets may sum from one (their float64 sum), for float32 rounding."""


@dataclass(frozen=True, eq=False)
class StepInputs:
    """One step's inputs, checked and normalised to numpy, one entry per item unless noted."""

    modalities: np.ndarray
    """int32 ``Modality`` values."""
    contents: list
    """Each item's content: UTF-8 bytes for text; a media item as given (file bytes or a decoded array),
    checked when it is decoded (``uform.media``)."""
    bags: np.ndarray
    """uint32 bag ids; every item its own bag (its index) when none were given."""
    temperature_groups: np.ndarray
    """uint32 temperature group of each item."""
    sides: np.ndarray
    """int32 ``LateInteractionSide`` values."""
    choice_offsets: np.ndarray
    """uint64, items plus one: item ``i``'s choices are ``choice_bytes[choice_offsets[i]:choice_offsets[i + 1]]``."""
    choice_bytes: np.ndarray
    """uint8, every item's legal bytes back to back; empty without choices."""
    choice_targets: np.ndarray
    """float32, the target probability of each entry of ``choice_bytes``."""
    relations: Relations | None
    """The checked relations, or None for no edges."""
    outputs_scalar: Scalar
    """The scalar type the pooled embeddings land as, read only with an arena."""

    def subset(self, items: np.ndarray) -> StepInputs:
        """These items alone (indices into this step's), each its own bag, with their choices (and targets) but
        no relations: what embedding them, or choosing after them, reads."""
        chosen, offsets = tape_entries(self.choice_offsets, items)
        return StepInputs(modalities=self.modalities[items], contents=[self.contents[i] for i in items],
                          bags=np.arange(len(items), dtype=np.uint32), temperature_groups=self.temperature_groups[items],
                          sides=self.sides[items], choice_offsets=offsets.astype(np.uint64),
                          choice_bytes=self.choice_bytes[chosen],
                          choice_targets=self.choice_targets[chosen] if self.choice_targets.size else self.choice_targets,
                          relations=None, outputs_scalar=self.outputs_scalar)


def _enum_values(name: str, value, item_count: int, enum: type) -> np.ndarray | None:
    array = per_item(name, value, item_count, np.uint32)
    if array is None:
        return None
    known = np.array([member.value for member in enum])
    bad = np.flatnonzero(~np.isin(array, known))
    if bad.size:
        item = int(bad[0])
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{name}: item {item} is {array[item]}, not a {enum.__name__}")
    return array.astype(np.int32)


MEDIA_SHAPE_FIELDS = {Modality.IMAGE: "batch.image with a positive patch_side",
                      Modality.VIDEO: "batch.video with a positive patch_side",
                      Modality.AUDIO: "batch.audio with a positive chunk_samples"}


def _check_modalities(modalities: np.ndarray, enabled: frozenset) -> None:
    left_out = np.flatnonzero(~np.isin(modalities, list(enabled)))
    if left_out.size:
        item = int(left_out[0])
        modality = Modality(modalities[item])
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"item {item}: {modality.name} items need "
                         f"{MEDIA_SHAPE_FIELDS[modality]}; the run leaves them out")


def _check_choice_values(owners: np.ndarray, data: np.ndarray, probabilities: np.ndarray,
                         counts: np.ndarray) -> None:
    """Each item's legal bytes distinct, its targets finite, non-negative and summing to one."""
    _repeated_bytes(owners, data)
    k = first_not_finite_non_negative(probabilities)
    if k is not None:
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"choice_targets: item {owners[k]} has target {probabilities[k]}, "
                         f"not a finite non-negative number")
    sums = np.bincount(owners, weights=probabilities, minlength=counts.size)
    off = np.flatnonzero((counts > 0) & (np.abs(sums - 1.0) > CHOICE_TARGET_TOLERANCE))
    if off.size:
        item = int(off[0])
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"choice_targets: item {item} sums to {sums[item]:.6g}, not 1")


def _repeated_bytes(owners: np.ndarray, data: np.ndarray) -> None:
    """Refuses an item offering one byte twice."""
    order = np.lexsort((data, owners))
    repeated = np.flatnonzero((owners[order][1:] == owners[order][:-1]) & (data[order][1:] == data[order][:-1]))
    if repeated.size:
        k = order[repeated[0]]
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"choices: item {owners[k]} offers byte {data[k]:#04x} twice")


def check_choose_inputs(texts, choices) -> StepInputs:
    """``text_choose``'s inputs, checked: a text per item (bytes or str; an empty one is a state of its MASK
    alone) and its legal bytes (as ``choices``; an item offering none gets an empty entry back), each byte
    offered once."""
    states = as_texts("texts", texts)
    count = len(states)
    inputs = StepInputs(modalities=np.full(count, Modality.TEXT, np.int32), contents=states,
                        bags=np.arange(count, dtype=np.uint32), temperature_groups=np.zeros(count, np.uint32),
                        sides=np.zeros(count, np.int32), choice_offsets=np.zeros(count + 1, np.uint64),
                        choice_bytes=np.empty(0, np.uint8), choice_targets=np.empty(0, np.float32), relations=None,
                        outputs_scalar=Scalar.F32)
    legal = as_texts("choices", choices, count)
    counts = np.fromiter(map(len, legal), np.int64, count=len(legal))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint64)
    data = np.frombuffer(b"".join(legal), np.uint8)
    _repeated_bytes(edge_owners(offsets), data)
    return replace(inputs, choice_offsets=offsets, choice_bytes=data)


def _choices(choices, choice_targets, item_count: int, max_choices_per_item: int):
    """The choices tape ``(offsets, bytes, targets)``, checked; empty when no choices are given."""
    if choices is None:
        if choice_targets is not None:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, "choice_targets: given without choices")
        return np.zeros(item_count + 1, np.uint64), np.empty(0, np.uint8), np.empty(0, np.float32)
    if choice_targets is None:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, "choice_targets: required with choices")
    legal = as_texts("choices", choices, item_count)
    targets = as_float_entries("choice_targets", choice_targets, item_count)

    counts = np.fromiter(map(len, legal), np.int64, count=item_count)
    over = np.flatnonzero(counts > max_choices_per_item)
    if over.size:
        item = int(over[0])
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"choices: item {item} offers {counts[item]} choices, past batch.max_choices_per_item "
                         f"{max_choices_per_item}")
    mismatched = np.flatnonzero(np.fromiter(map(len, targets), np.int64, count=item_count) != counts)
    if mismatched.size:
        item = int(mismatched[0])
        raise UFormError(ErrorCode.SHAPE_MISMATCH,
                         f"choice_targets: item {item} has {targets[item].size} targets for {counts[item]} choices")

    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint64)
    data = np.frombuffer(b"".join(legal), np.uint8)
    probabilities = np.concatenate([np.empty(0, np.float32), *targets])
    _check_choice_values(edge_owners(offsets), data, probabilities, counts)
    return offsets, data, probabilities


def check_step_inputs(modalities, contents, *, bags=None, temperature_groups=None, sides=None, choices=None,
                      choice_targets=None, relations: Relations | None = None, temperature_group_count: int = 1,
                      max_edges_per_device: int | None = None, max_choices_per_item: int = 0,
                      outputs_scalar: Scalar = Scalar.F32,
                      modalities_enabled: frozenset = frozenset({Modality.TEXT})) -> StepInputs:
    """Checks one step's inputs against each other and the run, answering them normalised; see the module doc.

    ``temperature_group_count`` is the run's derived ``contrastive.temperature_groups``,
    ``max_edges_per_device`` the edge capacity of these items (None: uncapped),
    ``max_choices_per_item`` the batch's, ``modalities_enabled`` the modalities the run trains.
    """
    content_entries = entries("contents", contents)
    item_count = len(content_entries)
    modality_values = _enum_values("modalities", modalities, item_count, Modality)
    if modality_values is None:
        if item_count:
            raise UFormError(ErrorCode.SHAPE_MISMATCH, f"modalities: 0 entries for {item_count} items")
        modality_values = np.empty(0, np.int32)
    _check_modalities(modality_values, modalities_enabled)
    texts = [as_text("contents", item, entry) if modality == Modality.TEXT else entry
             for item, (modality, entry) in enumerate(zip(modality_values, content_entries))]
    for item in np.flatnonzero(modality_values == Modality.TEXT):
        if not texts[item]:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"contents: item {item} is empty")

    bag_values = per_item("bags", bags, item_count, np.uint32)
    groups = per_item("temperature_groups", temperature_groups, item_count, np.uint32)
    if groups is not None:
        past = np.flatnonzero(groups >= temperature_group_count)
        if past.size:
            item = int(past[0])
            raise UFormError(ErrorCode.INVALID_ARGUMENT,
                             f"temperature_groups: item {item} selects group {groups[item]}, but the run has "
                             f"{temperature_group_count} (contrastive.temperature_groups)")
    side_values = _enum_values("sides", sides, item_count, LateInteractionSide)
    choice_offsets, choice_bytes, choice_probabilities = _choices(choices, choice_targets, item_count,
                                                                  max_choices_per_item)
    not_text = np.flatnonzero((np.diff(choice_offsets.astype(np.int64)) > 0) & (modality_values != Modality.TEXT))
    if not_text.size:
        item = int(not_text[0])
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"choices: item {item} is {Modality(modality_values[item]).name}; "
                         "only text items make choices")
    if relations is not None and not isinstance(relations, Relations):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"relations: expected Relations, got {type(relations).__name__}")
    check_relations(relations, item_count, max_edges_per_device)
    try:
        scalar = Scalar(outputs_scalar)
    except ValueError:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"outputs_scalar: {outputs_scalar!r} is not a Scalar") from None

    return StepInputs(
        modalities=modality_values,
        contents=texts,
        bags=bag_values if bag_values is not None else np.arange(item_count, dtype=np.uint32),
        temperature_groups=groups if groups is not None else np.zeros(item_count, np.uint32),
        sides=side_values if side_values is not None else np.zeros(item_count, np.int32),
        choice_offsets=choice_offsets, choice_bytes=choice_bytes, choice_targets=choice_probabilities,
        relations=relations, outputs_scalar=scalar,
    )
