"""The multimodal ``Trainer``: configuration, per-step inputs, packing and corruption, the model on its devices.

The host side is Python and numpy; the device side (:mod:`.encoder`) runs on the engine:

- :mod:`.config` -- the run's frozen, keyword-built configs, their derived
  defaults and :func:`validate_run`.
- :mod:`.step_inputs` -- :func:`check_step_inputs`, which checks and normalises
  one step's per-item arrays, with :mod:`.relations` for the contrastive edges.
- :mod:`.packing` -- :func:`pack_items`, items into a device's row grid.
- :mod:`.masking` -- :func:`corrupt`, keyed span corruption for the masked objective.
- :mod:`.schedule` -- :func:`learning_rate` of every step.
- :mod:`.stats`, :mod:`.arena` -- what a step reports and where it lands embeddings.
- :mod:`.late_interaction`, :mod:`.choices` -- the rows and targets of the late-interaction and
  calibrated-choices terms.
- :mod:`.media_step` -- a step's media items, prepared on the decoding pool and placed among the tokens.
- :mod:`.batch` -- :func:`step_batch`, a step's whole batch on the host.
- :mod:`.encoder` -- the encoder on a device; :mod:`.world` -- the world's step over several devices and
  processes; :mod:`.deferred` -- deferred steps and their prefetch; :mod:`.trainer` -- ``Trainer`` itself;
  :mod:`.checkpoint` -- its safetensors checkpoint.
"""

from .arena import Arena
from .config import (AudioShape, BatchShape, Choices, Contrastive, DerivedRun, ImageShape, LateInteraction, Masking,
                     Schedule, VideoShape, validate_run)
from .enums import LateInteractionSide, Modality, Negatives, Objective, PairLossForm, Scalar
from ..errors import ErrorCode, UFormError
from .late_interaction import maxsim
from .masking import corrupt
from .packing import Packed, pack_items
from .relations import Edges, Relations, check_relations, pair_targets
from .schedule import learning_rate
from .stats import TrainerStepStats
from .step_inputs import StepInputs, check_step_inputs
from .tapes import RowsTape
from .deferred import Deferred, DeferredOn, On
from .trainer import Trainer
from .vocabulary import MASK, PAD, VOCABULARY_SIZE

__all__ = [
    "Arena", "AudioShape", "Deferred", "DeferredOn", "On", "Trainer", "BatchShape", "Choices", "Contrastive", "DerivedRun", "Edges", "ErrorCode", "ImageShape",
    "LateInteraction", "LateInteractionSide", "MASK", "Masking", "Modality", "Negatives", "Objective", "PAD", "Packed",
    "PairLossForm", "Relations", "RowsTape", "Scalar", "Schedule", "StepInputs", "TrainerStepStats", "UFormError",
    "VOCABULARY_SIZE", "VideoShape", "check_relations", "check_step_inputs", "corrupt", "learning_rate",
    "maxsim", "pack_items", "pair_targets", "validate_run",
]
