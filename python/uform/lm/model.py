"""The byte language model on a device: embedding, a causal transformer stack, the head.

``DeviceModel`` is the model's resident training state (``uform.nn.resident``: flat parameters,
their gradient, the AdamW moments, in ``parameter_registry`` order) with the passes over it. The
blocks are ``uform.nn.TransformerStack``; the float64 twin of this model is
``uform.reference.lm_numpy``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels as K
from ..engine import Device
from ..nn.cache import RecentCache
from ..nn.resident import AdamW, HostState, ResidentState
from ..nn.tokens import CrossEntropyHead, TokenInputs
from ..nn.transformer import TransformerStack, layer_tensors
from .config import LanguageModelConfig, parameter_registry


@dataclass
class BatchBuffers:
    """One (batch, length) geometry's buffers: the tokens (positions and spans fixed at allocation) and
    the next-byte head."""

    tokens: TokenInputs
    head: CrossEntropyHead


class DeviceModel(ResidentState):
    """The resident state of the byte language model on `device`, and the passes over it."""

    def __init__(self, device: Device, shape: LanguageModelConfig, state: HostState, adamw: AdamW, *,
                 numerics: str = "identical"):
        super().__init__(device, parameter_registry(shape), state, adamw, numerics=numerics)
        self.shape = shape
        self.layer_weights = layer_tensors(self.weights, shape.layers)
        self.layer_grads = layer_tensors(self.weight_grads, shape.layers)
        self.stack = TransformerStack(device, shape.stack(), shape.length, fast=self.fast)
        self._batches = RecentCache(self._allocate)

    def buffers(self, batch: int, length: int) -> BatchBuffers:
        """The buffers of one (batch, length) geometry, made on first use (the few most recent geometries'
        are kept: ``uform.nn.cache``)."""
        return self._batches((batch, length))

    def _allocate(self, key: tuple[int, int]) -> BatchBuffers:
        batch, length = key
        n, vocabulary = batch * length, self.shape.vocab_size
        tokens = TokenInputs.allocate(self.device, n, vocabulary)
        tokens.positions.write(np.tile(np.arange(length, dtype=np.int32), batch))
        tokens.spans.write(K.attention_spans(n, length))
        return BatchBuffers(tokens=tokens, head=CrossEntropyHead.allocate(self.device, n, vocabulary))

    def forward(self, inputs: np.ndarray) -> BatchBuffers:
        """Logits of inputs (B, T) int32 into the head's buffers, keeping what the backward needs."""
        batch, length = inputs.shape
        n = batch * length
        buffers = self.buffers(batch, length)
        tokens = buffers.tokens
        tokens.ids.write(inputs.reshape(-1))
        tokens.embed(self.stack.buffers(n).input, self.weights["embedding"])
        hidden = self.stack.forward(self.layer_weights, n, tokens.positions, tokens.spans)
        buffers.head.forward(hidden, self.weights["head"])
        return buffers

    def losses(self, buffers: BatchBuffers, targets: np.ndarray, *, with_gradient: bool) -> np.ndarray:
        """Per-position cross-entropy (downloaded), and with_gradient the mean loss's dlogits."""
        buffers.head.score(targets, grad_scale=1.0 / targets.size, with_gradient=with_gradient)
        return buffers.head.losses.numpy()

    def backward(self, buffers: BatchBuffers, inputs: np.ndarray) -> None:
        """The gradient of the mean loss into self.gradients (overwritten), from the head's dlogits."""
        batch, length = inputs.shape
        n = batch * length
        tokens, work = buffers.tokens, self.stack.buffers(n).work
        buffers.head.backward(self.weight_grads["head"], work.dh, work.h_out, self.weights["head"])
        dh = self.stack.backward(self.layer_weights, self.layer_grads, n, tokens.positions, tokens.spans)
        tokens.embedding_backward(self.weight_grads["embedding"], dh, inputs, fast=self.fast)
