"""A step's batch on the host: its media decoded, its items packed into rows, corrupted for the masked
objectives, and its relations resolved into the pair targets each contrastive form reads (``StepBatch``).

:func:`step_batch` is the whole of it, a pure function of the run, the seed, the step and the items, so that
every device and process of a world builds the same batch; ``Trainer.step_batch`` calls it with the trainer's
run and seed. :func:`uncorrupted_batches` packs items for the reading verbs (encode, encode_tokens, text_choose)
a batch at a time. :func:`fold_normalisation` folds each pair-loss form's normalisation into the pair weights.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import kernels as K
from ..media.pool import shared_pool
from .choices import choice_batch, choice_state
from .encoder import StepBatch
from .enums import Modality, Objective, PairLossForm
from .late_interaction import QUERY_BIT, late_batch, late_targets
from .masking import corrupt
from .media_step import KIND_OF, POSITION_AXES, PendingMedia, PreparedMedia, media_tokens, place_media, submit_items
from .packing import Packed, pack_items
from .relations import pair_targets
from .step_inputs import StepInputs
from .vocabulary import IGNORED_TARGET


def step_batch(run, seed: int, inputs: StepInputs, bags_given: bool, step: int, corrupted: bool = True,
               decoded: PendingMedia | PreparedMedia | None = None, train_choices: bool | None = None,
               devices: int = 1) -> tuple[StepBatch, Packed]:
    """Decode media (unless `decoded` holds them already), pack, corrupt (unless not `corrupted`) and resolve
    one step's items on the host for the (validated) `run`, its draws keyed by `seed` and `step`: (StepBatch,
    Packed). `train_choices`: whether the items offering choices are states to choose after (default: when the
    run trains choices); a step's choices carry their targets. `devices`: the world's devices, whose rows are
    packed as one grid of blocks."""
    shape = run.batch
    columns = shape.max_columns_per_row
    if decoded is None:
        decoded = submit_items(inputs.modalities, inputs.contents, shape, shared_pool())
    media_items = decoded.result()
    train_choices = run.choices.weight > 0 if train_choices is None else train_choices
    choosing_items = np.diff(inputs.choice_offsets.astype(np.int64)) > 0 if train_choices else \
        np.zeros(len(inputs.contents), bool)
    contents, cut = [], 0
    for i, content in enumerate(inputs.contents):
        if i in media_items:
            content = media_tokens(media_items[i], KIND_OF[Modality(int(inputs.modalities[i]))])
        elif choosing_items[i]:
            content, was_cut = choice_state(content, columns)
            cut += was_cut
        contents.append(content)
    packed = pack_items(contents, inputs.bags if bags_given else None, shape.max_rows_per_device * devices,
                        columns, shape.max_segments_per_device * devices, shape.max_bags_per_device * devices,
                        block_rows=shape.max_rows_per_device)
    masking = run.masking if corrupted and run.objective != Objective.CONTRASTIVE else None
    items = packed.item_of_segment
    if masking is None:
        tokens, targets = packed.tokens.copy(), np.full(packed.tokens.shape, IGNORED_TARGET, np.int32)
    else:
        text_segments = (inputs.modalities[items] == Modality.TEXT) & ~choosing_items[items]
        tokens, targets = corrupt(packed, masking, seed, step, text_segments=text_segments)
    positions = np.repeat(packed.positions[..., None], POSITION_AXES, -1)
    media = None
    if media_items:
        media = place_media(packed, tokens.reshape(-1), positions.reshape(-1, POSITION_AXES),
                            inputs.modalities, media_items, masking, seed, step)
    sign, weight = pair_targets(inputs.relations, len(inputs.contents), run.contrastive.negatives,
                                run.contrastive.ambient_repulsion_weight)
    sign, weight = sign[np.ix_(items, items)], weight[np.ix_(items, items)].astype(np.float64)
    form, folded, ranked_norm = fold_normalisation(run.contrastive.pair_loss, sign, weight)
    late = None
    if run.late_interaction.weight > 0:
        late_sign, late_weight = late_targets(sign, weight, inputs.sides[items])
        late_form, late_folded, late_norm = fold_normalisation(
            run.late_interaction.pair_loss, late_sign, late_weight,
            anchors=int(np.count_nonzero(inputs.sides[items] & QUERY_BIT)))
        late = late_batch(packed, inputs.sides, run.late_interaction, late_sign.astype(np.float32),
                          late_folded, late_form, late_norm)
    choices = choice_batch(packed, choosing_items, inputs.choice_offsets, inputs.choice_bytes,
                           inputs.choice_targets if inputs.choice_targets.size else None,
                           shape.max_segments_per_device) if choosing_items.any() else None
    pooled_lengths, pooled_segments = packed.segment_length, None
    if media is not None and media.hidden_of_segment.any():  # a media segment pools its shown tokens alone
        pooled_lengths = packed.segment_length - media.hidden_of_segment
        pooled_segments = packed.segment_ids.copy()
        pooled_segments.reshape(-1)[media.hidden_tokens] = -1
    batch = StepBatch(
        tokens=tokens, targets=targets, positions=positions, token_segments=packed.segment_ids,
        segment_starts=(packed.segment_row * columns + packed.segment_start).astype(np.int32),
        segment_lengths=pooled_lengths.astype(np.int32), pooled_segments=pooled_segments,
        groups=inputs.temperature_groups[items].astype(np.int32), sign=sign.astype(np.float32),
        weight=folded, form=form, ranked_norm=ranked_norm, covered=int(np.count_nonzero(targets >= 0)),
        media=media, late=late, choices=choices)
    return batch, replace(packed, truncated=packed.truncated + cut) if cut else packed


def uncorrupted_batches(run, seed: int, inputs: StepInputs, items: np.ndarray, *, train_choices: bool = False):
    """(items, batch, packed) for the given items (indices into `inputs`, their media decoded once), packed
    uncorrupted into the run's batch shape a batch at a time (each batch's `items` are those it was offered;
    packing keeps a prefix of them and the rest go to the next) until every one is packed: what the reading verbs
    read, so an item's answer does not depend on its neighbours."""
    prepared = submit_items(inputs.modalities, inputs.contents, run.batch, shared_pool()).result()
    while items.size:
        ready = PreparedMedia({k: prepared[int(item)] for k, item in enumerate(items) if int(item) in prepared})
        batch, packed = step_batch(run, seed, inputs.subset(items), False, step=0, corrupted=False, decoded=ready,
                                   train_choices=train_choices)
        yield items, batch, packed
        items = items[packed.segment_of_item < 0]


def fold_normalisation(form: PairLossForm, sign: np.ndarray, weight: np.ndarray,
                       anchors: int | None = None) -> tuple[int, np.ndarray, float]:
    """Each form's normalisation (docs/encoder.md) folded into float32 pair weights, on the host in float64:
    SIGMOID w/A (A the anchors: every segment for the pooled term, the queries for late interaction);
    BALANCED w/Σw of its half; RANKED keeps w and answers 1/Σ_i (Σ_p w)(Σ_n w)."""
    count = sign.shape[0] if anchors is None else anchors
    attract, repel = sign > 0, sign < 0
    if form == PairLossForm.RANKED:
        pairs = float(np.sum(np.where(attract, weight, 0).sum(1) * np.where(repel, weight, 0).sum(1)))
        return K.FORM_RANKED, weight.astype(np.float32), 1.0 / pairs if pairs > 0 else 0.0
    if form == PairLossForm.BALANCED:
        folded = np.zeros_like(weight)
        for half in (attract, repel):
            total = weight[half].sum()
            if total > 0:
                folded[half] = weight[half] / total
        return K.FORM_WEIGHTED_SIGMOID, folded.astype(np.float32), 0.0
    return K.FORM_WEIGHTED_SIGMOID, (weight / max(count, 1)).astype(np.float32), 0.0
