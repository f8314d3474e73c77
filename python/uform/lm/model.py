"""The byte language model on a device: embedding, a causal transformer stack, the head.

``DeviceModel`` is the model's resident training state (``uform.nn.resident``: flat parameters,
their gradient, the AdamW moments, in ``parameter_registry`` order) with the passes over it. The
blocks are ``uform.nn.TransformerStack``; the float64 twin of this model is
``uform.reference.lm_numpy``.

A training step of a resident session in identical mode is replayed from a plan (``Device.record``):
the launches of the forward, the loss, the backward, the gradient check and the update, recorded once
per geometry; what changes from step to step (ids, targets, AdamW's step scalars) is written before each
replay in one upload (``StepUpload``), the embedding backward groups the tokens by id on the device
(``kernels.token_groups``), and the update reads the device's own verdict on the step
(``ResidentState.update_launches``). ``UFORM_STEP_PLANS`` picks how: "graph"
(the default: a device graph on a GPU, the loop of launches on the CPU), "loop", or "off" (each launch
from Python, as evaluation and fast mode always run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import kernels as K
from .. import layouts
from ..engine import Buffer, Device, Plan
from ..nn.cache import RecentCache
from ..nn.resident import AdamW, HostState, ResidentState
from ..nn.tokens import CrossEntropyHead, TokenInputs
from ..nn.transformer import TransformerStack, layer_tensors
from ..errors import value_error
from .config import LanguageModelConfig, parameter_registry


class StepUpload:
    """What a replayed step reads that changes from step to step, laid end to end in one int32 allocation that one
    upload writes: the inputs' ids, the targets and AdamW's step scalars (float32, [2, 3]:
    ``ResidentState.step_scalars``). ``views`` are the parts on the device, by name; ``write`` fills the host copy
    and uploads it."""

    def __init__(self, device: Device, batch: int, length: int):
        n = batch * length
        parts = (("ids", (n,), np.int32), ("targets", (n,), np.int32), ("scalars", (2, 3), np.float32))
        self.host = np.empty(sum(int(np.prod(shape)) for _, shape, _ in parts), np.int32)
        self.buffer = device.empty(self.host.size, np.int32)
        self.views: dict[str, Buffer] = {}
        self._host: dict[str, np.ndarray] = {}
        start = 0
        for name, shape, dtype in parts:
            size = int(np.prod(shape))
            self.views[name] = self.buffer.view(start, shape, dtype)
            self._host[name] = self.host[start:start + size].view(dtype).reshape(shape)
            start += size
        self._rows = (batch, length)

    def write(self, ids: np.ndarray, scalars: np.ndarray) -> None:
        """The parts of a step on ids (B, T + 1) with AdamW's `scalars`, in one upload."""
        part = self._host
        part["ids"].reshape(self._rows)[:] = ids[:, :-1]
        part["targets"].reshape(self._rows)[:] = ids[:, 1:]
        part["scalars"][:] = scalars
        self.buffer.write(self.host)


@dataclass
class BatchBuffers:
    """One (batch, length) geometry's buffers: the tokens (positions and spans fixed at allocation), the
    next-byte head, a replayed step's inputs (its ids and targets are the tokens' and the head's buffers) and
    its outcome: the head's losses, then the device's verdict on the step, read back in one download."""

    tokens: TokenInputs
    head: CrossEntropyHead
    upload: StepUpload
    outcome: Buffer
    step: Plan | None = None  # the training step's launches, once recorded


STEP_PLAN_MODES = ("graph", "loop", "off")


def step_plans(numerics: str, resident: bool) -> str:
    """How a session's training steps replay their launches (``UFORM_STEP_PLANS``). Always "off" for a stateless
    session, which opens a model for one step only, and in fast mode, whose launches depend on each step's data
    (the embedding backward's chunks) and whose GEMMs call cuBLAS."""
    mode = os.environ.get("UFORM_STEP_PLANS", "graph")
    if mode not in STEP_PLAN_MODES:
        raise value_error(f"UFORM_STEP_PLANS must be one of {STEP_PLAN_MODES}, got {mode!r}")
    return mode if resident and numerics != "fast" else "off"


class DeviceModel(ResidentState):
    """The resident state of the byte language model on `device`, and the passes over it."""

    def __init__(self, device: Device, shape: LanguageModelConfig, state: HostState, adamw: AdamW, *,
                 numerics: str = "identical", plans: str = "off"):
        """plans: how training steps replay their launches (``step_plans``)."""
        super().__init__(device, parameter_registry(shape), state, adamw, numerics=numerics, plans=plans)
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
        upload = StepUpload(self.device, batch, length)
        part = upload.views
        tokens = TokenInputs.allocate(self.device, n, vocabulary, ids=part["ids"])
        tokens.positions.write(np.tile(np.arange(length, dtype=np.int32), batch))
        tokens.spans.write(layouts.attention_spans(n, length))
        outcome = self.device.empty(n + 1)
        head = CrossEntropyHead.allocate(self.device, n, vocabulary, losses=outcome.view(0, n), targets=part["targets"])
        return BatchBuffers(tokens=tokens, head=head, upload=upload, outcome=outcome)

    def forward(self, inputs: np.ndarray) -> BatchBuffers:
        """Logits of inputs (B, T) int32 into the head's buffers, keeping what the backward needs."""
        buffers = self.buffers(*inputs.shape)
        buffers.tokens.ids.write(inputs.reshape(-1))
        self._forward(buffers)
        return buffers

    def _forward(self, buffers: BatchBuffers) -> None:
        """forward's launches, on the ids the buffers hold."""
        tokens, n = buffers.tokens, buffers.tokens.ids.size
        tokens.embed(self.stack.buffers(n).input, self.weights["embedding"])
        hidden = self.stack.forward(self.layer_weights, n, tokens.positions, tokens.spans)
        buffers.head.forward(hidden, self.weights["head"])

    def losses(self, buffers: BatchBuffers, targets: np.ndarray, *, with_gradient: bool) -> np.ndarray:
        """Per-position cross-entropy (downloaded), and with_gradient the mean loss's dlogits."""
        buffers.head.score(targets, grad_scale=1.0 / targets.size, with_gradient=with_gradient)
        return buffers.head.losses.numpy()

    def backward(self, buffers: BatchBuffers, inputs: np.ndarray) -> None:
        """The gradient of the mean loss into self.gradients (overwritten), from the head's dlogits."""
        if self.fast:
            self._backward_stack(buffers)
            buffers.tokens.embedding_backward(self.weight_grads["embedding"], self.stack.buffers(inputs.size).work.dh,
                                              inputs, fast=True)
            return
        self._backward(buffers)

    def _backward_stack(self, buffers: BatchBuffers) -> None:
        """The head's and the blocks' backward: the gradient at the stack's input into its work.dh."""
        tokens, n = buffers.tokens, buffers.tokens.ids.size
        work = self.stack.buffers(n).work
        buffers.head.backward(self.weight_grads["head"], work.dh, work.h_out, self.weights["head"])
        self.stack.backward(self.layer_weights, self.layer_grads, n, tokens.positions, tokens.spans)

    def _backward(self, buffers: BatchBuffers) -> None:
        """The identical backward's launches, on the ids the buffers hold (grouped by id on the device)."""
        self._backward_stack(buffers)
        tokens = buffers.tokens
        K.token_groups(tokens.order, tokens.offsets, tokens.ids, self.shape.vocab_size)
        K.embedding_backward(self.weight_grads["embedding"], self.stack.buffers(tokens.ids.size).work.dh, tokens.order,
                             tokens.offsets, self.shape.width)

    def planned_step(self, ids: np.ndarray, *, step: int, lr: float) -> tuple[np.ndarray, bool]:
        """Training step `step` at `lr` on ids (B, T + 1), replayed from the geometry's plan (recorded on first
        use): forward, losses, backward, the gradient check and the update, which the device skips on its own
        verdict (``update_launches``). Answers the per-position losses and whether the device took the update,
        read in one download: the step's one wait (the check's sums stay for ``summed_gradient_problem``). The
        same launches as forward, losses, backward, gradient_problem and adamw, all run whatever the verdict."""
        batch, length = ids.shape[0], ids.shape[1] - 1
        buffers = self.buffers(batch, length)
        buffers.upload.write(ids, self.step_scalars(step=step, lr=lr))
        if buffers.step is None:
            def launches():
                self._forward(buffers)
                buffers.head.cross_entropy(grad_scale=1.0 / (batch * length), with_gradient=True)
                self._backward(buffers)
                self.update_launches(buffers.head.losses, buffers.outcome.view(batch * length, 1),
                                     buffers.upload.views["scalars"])

            # The plan keeps the stack's buffers it reads alive, even should the stack's cache drop them.
            buffers.step = self.device.record(launches, keep=(self.stack.buffers(batch * length),),
                                              graph=self.plans == "graph")
        buffers.step.run()
        outcome = buffers.outcome.numpy()
        return outcome[:-1], bool(outcome[-1] == 1)
