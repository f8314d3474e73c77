"""The enumerations of the training API, valued exactly as the C ABI values them.

Each mirrors one C enum (``uform_modality_t``, ``uform_objective_t``, ...), so a
value crosses into the engine as its integer. ``Scalar`` is the one exception:
the seed names its members (``F32``, ``BF16``, ``F16``) but not their values, so
its numbers are this package's own.
"""

from __future__ import annotations

from enum import IntEnum


class Modality(IntEnum):
    """What the bytes of one training item hold (``uform_modality_t``)."""

    TEXT = 0
    """UTF-8 text, a byte per token."""
    IMAGE = 1
    """A JPEG, PNG or WebP file."""
    VIDEO = 2
    """An MP4 or WebM file."""
    AUDIO = 3
    """A WAV, FLAC, MP3 or Opus file."""


class Objective(IntEnum):
    """Which losses a training step relaxes (``uform_objective_t``)."""

    MASKED = 0
    """Masked reconstruction alone."""
    CONTRASTIVE = 1
    """The pairwise contrastive loss alone."""
    JOINT = 2
    """Both, joined at the final-norm states."""


class Negatives(IntEnum):
    """Which pairs the contrastive loss pushes apart (``uform_negatives_t``)."""

    AMBIENT = 0
    """Repel edges, and every pair no edge names at the ambient repulsion weight."""
    NAMED = 1
    """Repel edges alone."""


class PairLossForm(IntEnum):
    """How a contrastive term turns a row of scores into forces (``uform_pair_loss_form_t``)."""

    DERIVED = 0
    """The term's own form: sigmoid for pooled embeddings, ranked for token vectors."""
    BALANCED = 1
    """The sigmoid cross-entropy of every cell, its attract and repel halves normalized apart."""
    RANKED = 2
    """The sigmoid cross-entropy of every positive's score over every negative's, where the bias cancels."""
    SIGMOID = 3
    """SigLIP's sigmoid cross-entropy of every cell, each repel weighed like an attract."""


class LateInteractionSide(IntEnum):
    """Which side of a late-interaction score an item takes (``uform_late_interaction_side_t``)."""

    NONE = 0
    """The item takes no part in late interaction."""
    QUERY = 1
    """The item's tokens score the documents it attracts and repels."""
    DOCUMENT = 2
    """The item's tokens are scored by the queries naming it."""
    QUERY_AND_DOCUMENT = 3
    """The item plays both sides."""


class Scalar(IntEnum):
    """The scalar type a step's pooled embeddings land as in an :class:`~uform.training.Arena`."""

    F32 = 0
    BF16 = 1
    F16 = 2
