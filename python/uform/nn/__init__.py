"""Model building blocks composed from engine kernels, shared by both trainers."""

from .transformer import LAYER_TENSORS, StackGeometry, TransformerStack

__all__ = ["LAYER_TENSORS", "StackGeometry", "TransformerStack"]
