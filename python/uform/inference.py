"""``uform.Encoder``: a trained encoder loaded from its checkpoint alone, for embedding items.

    encoder = uform.Encoder.load("runs/2026-11-29-120000/model.safetensors")
    vectors = encoder.encode(uform.Modality.TEXT, ["a small red panda", "the capital of france"])

A ``Trainer`` checkpoint (``uform.training.checkpoint``) stores its run as JSON beside the
weights: geometry, objective, batch shape, masking, contrastive settings and schedule, and the
seed. ``Encoder.load`` rebuilds that run from the file and resumes it on the executor's device,
so nothing has to be restated, and ``encode`` is the saving trainer's ``Trainer.encode``
(docs/encoder.md, "Embedding items"): the same bits for the same items, on the CPU and on a GPU, in
identical numerics (a checkpoint of a fast run loads in fast mode unless ``numerics="identical"`` is
passed; fast embeddings are deterministic on one GPU model, but not bit-equal across packings or devices).

Where the run trained them, the heads beyond pooling answer too: ``encode_tokens`` the unit token
vectors late interaction scores (``uform.maxsim`` scores them), ``text_choose`` the masked head's
distribution over legal bytes (any run with a masked head).
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from .executor import Executor, default_executor, executor_from
from .training import checkpoint
from .training.config import (AudioShape, BatchShape, Choices, Contrastive, ImageShape, LateInteraction, Masking,
                              Schedule, VideoShape)
from .training.enums import LateInteractionSide, Modality, Negatives, Objective, PairLossForm
from .errors import ErrorCode, UFormError
from .training.tapes import RowsTape
from .training.trainer import Trainer

DEFAULT_BATCH_SIZE = 4096
"""Items ``Encoder.encode`` hands the model per call: bounds the host memory of one chunk."""


def checkpoint_metadata(path) -> dict:
    """The checked metadata of a Trainer checkpoint: ``step`` and ``seed`` (ints) and ``run`` (the run as a
    dict). Anything else is refused with a UFormError naming the file."""
    with checkpoint.opened(path, "Encoder.load") as saved:
        return saved.metadata


def run_settings(run: dict) -> dict:
    """``Trainer.init_vram`` keyword arguments from a checkpoint's run JSON (enums stored by name)."""
    batch = dict(run["batch"])
    shapes = {"image": ImageShape, "video": VideoShape, "audio": AudioShape}
    for name, shape in shapes.items():
        batch[name] = shape(**batch[name])
    contrastive = dict(run["contrastive"], negatives=Negatives[run["contrastive"]["negatives"]],
                       pair_loss=PairLossForm[run["contrastive"]["pair_loss"]])
    late = dict(run["late_interaction"], pair_loss=PairLossForm[run["late_interaction"]["pair_loss"]])
    return {"depth": run["depth"], "hidden": run["hidden"], "objective": Objective[run["objective"]],
            "batch": BatchShape(**batch), "masking": Masking(**run["masking"]),
            "contrastive": Contrastive(**contrastive), "late_interaction": LateInteraction(**late),
            "choices": Choices(**run["choices"]), "schedule": Schedule(**run["schedule"])}


def item_modalities(modalities, count: int) -> list:
    """One Modality per item from what a caller passes: a Modality, or its name ("text", "IMAGE"), for every item;
    or a sequence of those, one per item (a string is a name, never a sequence of characters)."""
    def one(value):
        if isinstance(value, str):
            try:
                return Modality[value.upper()]
            except KeyError:
                raise UFormError(ErrorCode.INVALID_ARGUMENT, f"modalities: {value!r} names no modality; one of "
                                                             f"{[m.name.lower() for m in Modality]}") from None
        return value

    if isinstance(modalities, (Modality, str)):
        return [one(modalities)] * count
    return [one(value) for value in modalities]


def items_of(contents) -> list:
    """The items of a call: a sequence of them; a lone str or bytes is refused, since a list of its characters is
    never what was meant."""
    if isinstance(contents, (str, bytes)):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"contents: a sequence of items, got one "
                                                     f"{type(contents).__name__}; pass [item] to embed one")
    return list(contents)


class Encoder:
    """A trained encoder on one device; ``Encoder.load`` makes one from a checkpoint. Loaded over an executor of
    several devices, it runs on the first of them (docs/training-api.md)."""

    def __init__(self, trainer: Trainer, path: str):
        self._trainer = trainer
        self.path = path

    @classmethod
    def load(cls, path, executor: Executor | None = None, *, numerics: str | None = None) -> Encoder:
        """The encoder a ``Trainer.save`` wrote to `path`, on `executor` (an Executor, a Device, 'cpu' or
        'gpu:N'; default: ``uform.default_executor()``; of several devices, its first), in numeric mode `numerics`
        (default: the mode it was trained in, which the checkpoint records). The checkpoint of any world loads:
        it records the run of the whole world's batch, which one device holds."""
        metadata = checkpoint_metadata(path)
        executor = default_executor() if executor is None else executor_from(executor)
        executor = Executor(executor.devices[:1])  # embedding an item never depends on its batch's other items
        try:
            settings = run_settings(metadata["run"])
        except (KeyError, TypeError, ValueError) as error:
            raise UFormError(ErrorCode.CORRUPTED, f"Encoder.load: {os.fsdecode(path)}: the run it stores is not "
                                                  f"one uform reads ({type(error).__name__}: {error})") from None
        trainer = Trainer.init_vram(executor, resume=path, seed=metadata["seed"], training=False, numerics=numerics,
                                    **settings)
        return cls(trainer, os.fsdecode(path))

    @property
    def hidden(self) -> int:
        """The full embedding width."""
        return self._trainer.run.hidden

    @property
    def widths(self) -> tuple[int, ...]:
        """The widths the model was trained to embed at: its Matryoshka prefixes, else the full width."""
        return tuple(self._trainer.run.contrastive.matryoshka_dimensions) or (self.hidden,)

    @property
    def max_columns(self) -> int:
        """Positions of one row: a longer item is cut to this many tokens."""
        return self._trainer.run.batch.max_columns_per_row

    @property
    def modalities(self) -> frozenset:
        """The modalities the model embeds."""
        return self._trainer._modalities_enabled()

    @property
    def steps(self) -> int:
        """Optimizer steps the model was trained for."""
        return self._trainer.completed_steps

    @property
    def trainer(self) -> Trainer:
        """The resumed run underneath (its parameters, its run)."""
        return self._trainer

    def encode(self, modalities, contents, /, *, width: int | None = None,
               batch_size: int = DEFAULT_BATCH_SIZE, any_width: bool = False) -> np.ndarray:
        """float32 (items, width) unit-norm embeddings of the uncorrupted items: ``Trainer.encode`` of the
        saving trainer, bit for bit. `modalities` is one Modality (or its name) per item, or one for all of them;
        `width` one of the widths the run trained (``widths``: its Matryoshka prefixes, else the hidden width;
        default: all of it), or with `any_width` any prefix of the hidden width; `batch_size` the items handed to
        the model at once (the answer does not depend on it). Text items longer than a row are cut to a row, with
        a warning that counts them."""
        contents = items_of(contents)
        modalities = item_modalities(modalities, len(contents))
        if width is not None and not any_width and width not in self.widths:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"width: the run trained the widths {list(self.widths)}, "
                                                         f"not {width!r}; pass any_width=True (the embed program's "
                                                         "--any-width) for another prefix")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"batch_size: must be a positive integer, got {batch_size!r}")
        if len(modalities) != len(contents):
            raise UFormError(ErrorCode.SHAPE_MISMATCH, f"modalities: {len(modalities)} entries for "
                                                       f"{len(contents)} items")
        long = sum(1 for modality, content in zip(modalities, contents)
                   if modality == Modality.TEXT and isinstance(content, (str, bytes))
                   and len(content.encode() if isinstance(content, str) else content) > self.max_columns)
        if long:
            warnings.warn(f"{long} of {len(contents)} text items are longer than a row ({self.max_columns} bytes) "
                          "and were cut to it", stacklevel=2)
        chunks = [self._trainer.encode(modalities[start:start + batch_size], contents[start:start + batch_size],
                                       width=width) for start in range(0, len(contents), batch_size)]
        return np.concatenate(chunks) if chunks else self._trainer.encode([], [], width=width)

    def encode_tokens(self, modalities, contents, /, *, side=LateInteractionSide.DOCUMENT) -> list[np.ndarray]:
        """The unit token vectors of each item (``Trainer.encode_tokens`` of the saving trainer): every position
        of a DOCUMENT, the first ``max_query_span`` of a QUERY; for a run that trained late interaction."""
        contents = items_of(contents)
        return self._trainer.encode_tokens(item_modalities(modalities, len(contents)), contents, side=side)

    def text_choose(self, texts, choices, /) -> RowsTape:
        """The distribution over each text's legal bytes at the position after it (``Trainer.text_choose`` of the
        saving trainer): a float32 RowsTape that a step takes back as ``choice_targets``."""
        return self._trainer.text_choose(texts, choices)
