"""uform: a training engine for multimodal transformer encoders on a Mojo kernel core.

``uform.Trainer`` trains the multimodal encoder and ``uform.Encoder`` embeds with one loaded from its
checkpoint; ``uform.LanguageModelTrainer`` trains the small byte language model; all on an
``Executor``'s GPU or the CPU with the same bits.
``uform.Mesh`` joins the processes of a run (``docs/mesh.md``).
``uform.kernels`` exposes every engine kernel on device buffers.
"""

from . import kernels
from .engine import ENGINE_VARIANT, Buffer, Device, gpu_count
from .executor import Executor, default_executor, numeric_mode, set_default_executor, set_numeric_mode
from .inference import Encoder
from .lm import LanguageModelConfig, LanguageModelTrainer, SmallByteLanguageModelTrainer
from .mesh import GPUClass, Mesh, MeshDescription, MeshOptions, MultimemTier
from .training import (Arena, AudioShape, BatchShape, Choices, Contrastive, Deferred, Edges, ErrorCode,
                       ImageShape, LateInteraction, LateInteractionSide, Masking, Modality, Negatives, Objective,
                       PairLossForm, Relations, RowsTape, Scalar, Schedule, Trainer, TrainerStepStats, UFormError,
                       VideoShape, maxsim)

__all__ = [
    "Arena", "AudioShape", "BatchShape", "Choices", "Contrastive", "Deferred", "Edges", "ErrorCode", "ImageShape",
    "LateInteraction", "LateInteractionSide", "Masking", "Modality", "Negatives", "Objective", "PairLossForm",
    "Relations", "RowsTape", "Scalar", "Schedule", "Trainer", "TrainerStepStats", "UFormError", "VideoShape",
    "Buffer", "Device", "ENGINE_VARIANT", "Encoder", "Executor", "GPUClass", "LanguageModelConfig",
    "LanguageModelTrainer", "Mesh", "MeshDescription", "MeshOptions", "MultimemTier",
    "SmallByteLanguageModelTrainer", "default_executor", "gpu_count", "kernels", "maxsim", "numeric_mode",
    "set_default_executor", "set_numeric_mode",
]
