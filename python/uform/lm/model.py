"""The byte language model on a device: embedding, a causal transformer stack, the head.

``DeviceModel`` holds the resident training state on one device (flat
parameters, their gradient, the AdamW moments) and runs the passes. Every
tensor is a view into the flat buffers, in ``parameter_registry`` order, so the
state leaves the device as three downloads. The float64 twin of this model is
``uform.lm.reference``; the blocks are ``uform.nn.TransformerStack``.
"""

from __future__ import annotations

import numpy as np

from .. import kernels as K
from ..engine import Buffer, Device
from ..nn.transformer import StackGeometry, TransformerStack, embedding_backward, flat_views, layer_views
from .config import LanguageModelConfig, parameter_registry


class DeviceModel:
    """Parameters, gradient and AdamW moments resident on `device`, and the passes over them."""

    def __init__(self, device: Device, shape: LanguageModelConfig, parameters: np.ndarray, m: np.ndarray,
                 v: np.ndarray):
        self.device = device
        self.shape = shape
        self.parameters = device.put(parameters)
        self.gradients = device.zeros(shape.n_total)
        self.m = device.put(m)
        self.v = device.put(v)
        registry = parameter_registry(shape)
        self.p = flat_views(self.parameters, registry)
        self.g = flat_views(self.gradients, registry)
        geometry = StackGeometry(width=shape.width, heads=shape.heads, kv_heads=shape.kv_heads,
                                 head_dim=shape.head_dim, mlp=shape.mlp, layers=shape.layers,
                                 norm_eps=shape.norm_eps, rope_base=shape.rope_base, causal=True)
        self.stack = TransformerStack(device, geometry, shape.length)
        self._io: dict[tuple[int, int], dict[str, Buffer]] = {}

    def download_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.parameters.numpy(), self.m.numpy(), self.v.numpy()

    def io(self, batch: int, length: int) -> dict[str, Buffer]:
        """Input, target and output buffers of one (batch, length) geometry, made on first use."""
        key = (batch, length)
        if key not in self._io:
            c, d, n = self.shape, self.device, batch * length
            self._io[key] = dict(ids=d.empty(n, np.int32), targets=d.empty(n, np.int32),
                                 positions=d.put(np.tile(np.arange(length, dtype=np.int32), batch)),
                                 spans=d.put(K.attention_spans(n, length)),
                                 logits=d.empty((n, c.vocab_size)), losses=d.empty(n),
                                 dlogits=d.empty((n, c.vocab_size)), order=d.empty(n, np.int32),
                                 offsets=d.empty(c.vocab_size + 1, np.int32))
        return self._io[key]

    def forward(self, inputs: np.ndarray) -> dict[str, Buffer]:
        """Logits of inputs (B, T) int32, keeping what the backward needs; answers the io buffers."""
        c = self.shape
        batch, length = inputs.shape
        n = batch * length
        io = self.io(batch, length)
        io["ids"].write(inputs.reshape(-1))
        K.embedding_forward(self.stack.input_buffer(n), self.p["embedding"], io["ids"], c.width)
        hidden = self.stack.forward(layer_views(self.p, c.layers), n, io["positions"], io["spans"])
        K.gemm(io["logits"], hidden, self.p["head"], n, c.vocab_size, c.width)
        return io

    def losses(self, io: dict[str, Buffer], targets: np.ndarray, *, with_gradient: bool) -> np.ndarray:
        """Per-position cross-entropy (downloaded), and with_gradient the mean loss's dlogits."""
        io["targets"].write(targets.reshape(-1))
        K.cross_entropy(io["losses"], io["dlogits"] if with_gradient else None, io["logits"], io["targets"],
                        grad_scale=1.0 / targets.size)
        return io["losses"].numpy()

    def backward(self, io: dict[str, Buffer], inputs: np.ndarray) -> None:
        """The gradient of the mean loss into self.gradients (overwritten), from io["dlogits"]."""
        c = self.shape
        batch, length = inputs.shape
        n = batch * length
        _, work = self.stack.buffers(n)
        K.gemm(self.g["head"], work["h_out"], io["dlogits"], c.width, c.vocab_size, n, transpose_a=True)
        K.gemm(work["dh"], io["dlogits"], self.p["head"], n, c.width, c.vocab_size, transpose_b=True)
        dh = self.stack.backward(layer_views(self.p, c.layers), layer_views(self.g, c.layers), n,
                                 io["positions"], io["spans"])
        embedding_backward(self.g["embedding"], dh, inputs, io["order"], io["offsets"], c.width)

    def adamw(self, *, step: int, lr: float, betas, eps: float, weight_decay: float) -> None:
        K.adamw(self.parameters, self.gradients, self.m, self.v, step=step, lr=lr, betas=betas, eps=eps,
                weight_decay=weight_decay)
