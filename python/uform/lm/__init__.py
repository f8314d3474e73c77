"""Host side of the decoder-only byte language model trainer.

``config`` fixes the dimensions and the flat parameter layout, ``corpus`` turns
a byte corpus into reproducible id batches,
``checkpoint`` validates training states and writes/reads them as JSON or
binary checkpoints, ``model`` runs the model on a device through the engine's
kernels, and ``trainer`` is the public ``LanguageModelTrainer``. The float64
numpy and PyTorch twins of the model are in ``uform.reference``.
"""

from .checkpoint import (
    FORMAT,
    encode_json_checkpoint,
    read_binary_checkpoint,
    read_json_checkpoint,
    read_json_checkpoint_bytes,
    validate_state,
    write_binary_checkpoint,
    write_json_checkpoint,
)
from .config import LanguageModelConfig, flatten_parameters, parameter_registry, split_parameters
from .corpus import TokenBatches
from .trainer import LanguageModelTrainer, SmallByteLanguageModelTrainer, state_sha256

__all__ = [
    "FORMAT",
    "LanguageModelConfig",
    "LanguageModelTrainer",
    "SmallByteLanguageModelTrainer",
    "TokenBatches",
    "encode_json_checkpoint",
    "flatten_parameters",
    "parameter_registry",
    "read_binary_checkpoint",
    "read_json_checkpoint",
    "read_json_checkpoint_bytes",
    "split_parameters",
    "state_sha256",
    "validate_state",
    "write_binary_checkpoint",
    "write_json_checkpoint",
]
