"""Host side of the decoder-only byte language model trainer.

``config`` fixes the dimensions and the flat parameter layout, ``reference`` is
the float64 numpy model (forward, hand-written backward, AdamW) the engine is
checked against, ``corpus`` turns a byte corpus into reproducible id batches,
``checkpoint`` validates training states and writes/reads them as JSON or
binary checkpoints, ``model`` runs the model on a device through the engine's
kernels, and ``trainer`` is the public ``LanguageModelTrainer``.
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
from .reference import adamw_step, logits, loss, loss_and_gradients
from .trainer import LanguageModelTrainer, SmallByteLanguageModelTrainer, state_sha256

__all__ = [
    "FORMAT",
    "LanguageModelConfig",
    "LanguageModelTrainer",
    "SmallByteLanguageModelTrainer",
    "TokenBatches",
    "adamw_step",
    "encode_json_checkpoint",
    "flatten_parameters",
    "logits",
    "loss",
    "loss_and_gradients",
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
