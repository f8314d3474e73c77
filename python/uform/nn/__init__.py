"""Model building blocks composed from engine kernels, shared by both trainers.

- :mod:`.resident` -- the resident training state (registry, flat parameters, gradient, AdamW moments).
- :mod:`.transformer` -- the stack of transformer blocks, its tensors and its buffers.
- :mod:`.tokens` -- the embedding in and the linear cross-entropy head out.
- :mod:`.cache` -- buffers kept per batch geometry, the few most recent.
"""

from .resident import AdamW, HostState, ResidentState, named_tensors, registry_size, tensor_registry
from .tokens import CrossEntropyHead, TokenInputs
from .transformer import LAYER_TENSORS, LayerTensors, StackBuffers, StackGeometry, TransformerStack

__all__ = ["AdamW", "CrossEntropyHead", "HostState", "LAYER_TENSORS", "LayerTensors", "ResidentState",
           "StackBuffers", "StackGeometry", "TokenInputs", "TransformerStack", "named_tensors", "registry_size",
           "tensor_registry"]
