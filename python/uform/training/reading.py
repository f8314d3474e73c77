"""The trainer's reading verbs over any number of items: each packs the items a batch at a time into the run's
batch shape, uncorrupted (``uform.training.batch.uncorrupted_batches``), asks the model for what the verb reads,
and places every item's answer where the item was given, so an item's answer is the same alone or among others.
The verbs (``Trainer.encode``, ``encode_tokens``, ``text_choose``) check their arguments first."""

from __future__ import annotations

import numpy as np

from .batch import uncorrupted_batches
from .encoder import EncoderModel
from .enums import LateInteractionSide
from .late_interaction import side_rows
from .step_inputs import StepInputs


def pooled_embeddings(model: EncoderModel, run, seed: int, inputs: StepInputs, width: int) -> np.ndarray:
    """(items, width) float32: each item's unit-norm mean final state, its first `width` dimensions."""
    embeddings = np.zeros((len(inputs.contents), width), np.float32)
    for items, batch, packed in uncorrupted_batches(run, seed, inputs, np.arange(len(inputs.contents))):
        embeddings[items[packed.item_of_segment]] = model.embeddings(batch, width)
    return embeddings


def token_vectors(model: EncoderModel, run, seed: int, inputs: StepInputs,
                  side: LateInteractionSide) -> list[np.ndarray]:
    """Per item the (rows, width) unit token vectors of the late-interaction head on `side`."""
    vectors = [None] * len(inputs.contents)
    for items, batch, packed in uncorrupted_batches(run, seed, inputs, np.arange(len(inputs.contents))):
        sides = np.full(packed.segment_count, int(side), np.int32)
        rows = side_rows(packed, sides, run.late_interaction.max_query_span)
        tokens, _, starts, counts = rows[0 if side == LateInteractionSide.QUERY else 1]
        found = model.late_token_vectors(batch, tokens)
        for segment, item in enumerate(items[packed.item_of_segment]):
            vectors[item] = found[starts[segment]:starts[segment] + counts[segment]]
    return vectors


def choice_probabilities(model: EncoderModel, run, seed: int, inputs: StepInputs) -> np.ndarray:
    """The masked head's probabilities over every item's legal bytes, laid out as `inputs.choice_bytes`."""
    offsets = inputs.choice_offsets.astype(np.int64)
    probabilities = np.zeros(inputs.choice_bytes.size, np.float32)
    choosing = np.flatnonzero(np.diff(offsets) > 0)
    for items, batch, _ in uncorrupted_batches(run, seed, inputs, choosing, train_choices=True):
        answered = model.choice_probabilities(batch)
        within = batch.choices.offsets
        for k, item in enumerate(items[batch.choices.items]):
            probabilities[offsets[item]:offsets[item + 1]] = answered[within[k]:within[k + 1]]
    return probabilities
