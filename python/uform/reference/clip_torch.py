"""A plain CLIP-style pair trainer in PyTorch: the peer uform's trained models are measured against.

Independent of uform's engine and of its tower (``encoder_torch`` is uform's own tower; this is what a
PyTorch user writes for a small CLIP): two towers of ``depth`` pre-LayerNorm blocks of width ``width``
(``nn.TransformerEncoderLayer``, GELU, MLP 4×, heads of 64; or one stack both sides read,
``TowerShape.shared_blocks``), learned absolute position embeddings, mean
pooling over each item's tokens, SigLIP's sigmoid loss between the two sides of each pair (queries
against documents, ``exp(t)·cos + b``, t and b learned from log 10 and −10), AdamW with a linear warmup
and a cosine decay. Text is read as UTF-8 bytes (no tokenizer, as uform reads it); an image is cut into
``patch_side`` × ``patch_side`` RGB patches, its pixels scaled to [−1, 1], through a linear patch
embedding.

``same`` marks the pairs of a step that share a document (a caption drawn twice): those cells are left out
of the loss, neither attracted nor repelled, as uform's ``ignore`` edges leave them.

Needs torch, which uform does not.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TowerShape:
    """The size of both towers and of the items they read."""

    depth: int = 2
    width: int = 128
    max_bytes: int = 64
    """Text positions: longer texts are cut."""
    patch_side: int = 8
    max_patches: int = 64
    """Image positions: an image's grid of patches (row-major) must fit."""
    shared_blocks: bool = False
    """One stack of blocks read by both sides, as uform's one tower is (each side keeps its input map and
    position table); a CLIP has a stack per side."""


def image_patches(encoded: bytes, patch_side: int) -> np.ndarray:
    """An encoded image's RGB patches, ``(count, patch_side² · 3)`` float32 in [−1, 1], row-major, flattened
    ``(y, x, c)``; a side not a multiple of the patch is cropped."""
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))
    rows, columns = pixels.shape[0] // patch_side, pixels.shape[1] // patch_side
    blocks = (pixels[:rows * patch_side, :columns * patch_side]
              .reshape(rows, patch_side, columns, patch_side, 3).transpose(0, 2, 1, 3, 4)
              .reshape(rows * columns, patch_side * patch_side * 3))
    return blocks.astype(np.float32) / 127.5 - 1


def text_bytes(texts, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, lengths): each text's UTF-8 bytes cut to ``max_bytes``, padded with 256."""
    ids = np.full((len(texts), max_bytes), 256, np.int64)
    lengths = np.zeros(len(texts), np.int64)
    for row, text in enumerate(texts):
        data = np.frombuffer(text.encode("utf-8") if isinstance(text, str) else text, np.uint8)[:max_bytes]
        ids[row, :len(data)] = data
        lengths[row] = max(len(data), 1)
    return ids, lengths


def build(torch, shape: TowerShape, query: str, seed: int):
    """The model: ``query`` is ``"text"`` or ``"image"``; documents are text."""
    nn = torch.nn
    torch.manual_seed(seed)

    def blocks():
        layer = nn.TransformerEncoderLayer(shape.width, shape.width // 64, 4 * shape.width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        return nn.TransformerEncoder(layer, shape.depth, norm=nn.LayerNorm(shape.width), enable_nested_tensor=False)

    shared = blocks() if shape.shared_blocks else None

    class Tower(nn.Module):
        def __init__(self, inputs: nn.Module, positions: int):
            super().__init__()
            self.inputs, self.blocks = inputs, shared if shared is not None else blocks()
            self.positions = nn.Parameter(torch.randn(positions, shape.width) * 0.02)

        def forward(self, x, lengths):
            h = self.inputs(x)
            n = h.shape[1]
            h = h + self.positions[:n]
            padding = torch.arange(n, device=h.device)[None, :] >= lengths[:, None]
            y = self.blocks(h, src_key_padding_mask=padding)
            keep = (~padding).to(y.dtype)[..., None]
            return (y * keep).sum(1) / keep.sum(1)

    class Pairs(nn.Module):
        def __init__(self):
            super().__init__()
            def text_tower():  # bytes 0..255 and the padding id 256
                return Tower(nn.Embedding(257, shape.width), shape.max_bytes)

            self.document = text_tower()
            self.query = text_tower() if query == "text" else \
                Tower(nn.Linear(3 * shape.patch_side ** 2, shape.width), shape.max_patches)
            self.log_scale = nn.Parameter(torch.tensor(math.log(10.0)))
            self.bias = nn.Parameter(torch.tensor(-10.0))

    return Pairs()


def sigmoid_loss(torch, queries, documents, log_scale, bias, same=None):
    """SigLIP: ``Σ_ij softplus(−s_ij · (exp(t)·cos_ij + b)) / n``, s = +1 on the diagonal, −1 elsewhere, cells
    ``same`` marks (off the diagonal) left out."""
    F = torch.nn.functional
    q, d = F.normalize(queries, dim=1), F.normalize(documents, dim=1)
    z = torch.exp(log_scale) * q @ d.T + bias
    n = z.shape[0]
    sign = 2 * torch.eye(n, device=z.device) - 1
    cells = F.softplus(-sign * z)
    if same is not None:
        cells = torch.where(torch.as_tensor(same, device=z.device) & (sign < 0), torch.zeros_like(cells), cells)
    return cells.sum() / n


def learning_rate(step: int, steps: int, peak: float, warmup: int, floor: float = 1e-5) -> float:
    """Linear warmup to ``peak`` over ``warmup`` steps, then a cosine to ``floor`` at ``steps`` (step from 1)."""
    if step <= warmup:
        return peak * step / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def decayed_adamw(torch, model, *, learning_rate: float, weight_decay: float):
    """AdamW over `model`'s parameters, decaying the matrices only (not gains, biases or temperatures)."""
    decayed = [p for p in model.parameters() if p.dim() >= 2]
    kept = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": weight_decay},
                              {"params": kept, "weight_decay": 0.0}], lr=learning_rate)


class PairTrainer:
    """Trains :func:`build`'s model on (query, document) pairs, a step at a time, and embeds items."""

    def __init__(self, torch, shape: TowerShape, query: str, *, steps: int, learning_rate: float = 5e-4,
                 warmup: int | None = None, weight_decay: float = 0.01, seed: int = 0, device: str = "cpu"):
        self.torch, self.shape, self.query_kind, self.device = torch, shape, query, device
        self.model = build(torch, shape, query, seed).to(device)
        self.steps, self.peak = steps, learning_rate
        self.warmup = min(steps // 10, 400) if warmup is None else warmup
        self.optimizer = decayed_adamw(torch, self.model, learning_rate=learning_rate, weight_decay=weight_decay)
        self.completed = 0

    def _side(self, tower, items, kind: str):
        torch = self.torch
        if kind == "text":
            ids, lengths = text_bytes(items, self.shape.max_bytes)
            x = torch.as_tensor(ids, device=self.device)
        else:
            patches = [image_patches(item, self.shape.patch_side) for item in items]
            count = max(len(p) for p in patches)
            if count > self.shape.max_patches:
                raise ValueError(f"an image of {count} patches passes max_patches {self.shape.max_patches}")
            batch = np.zeros((len(items), count, patches[0].shape[1]), np.float32)
            for row, p in enumerate(patches):
                batch[row, :len(p)] = p
            lengths = np.array([len(p) for p in patches])
            x = torch.as_tensor(batch, device=self.device)
        return tower(x, torch.as_tensor(lengths, device=self.device))

    def step(self, queries, documents, same=None) -> float:
        self.completed += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.completed, self.steps, self.peak, self.warmup)
        self.model.train()
        loss = sigmoid_loss(self.torch, self._side(self.model.query, queries, self.query_kind),
                            self._side(self.model.document, documents, "text"), self.model.log_scale,
                            self.model.bias, same)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def encode(self, items, kind: str, batch_size: int = 256) -> np.ndarray:
        """Unit embeddings of ``items``: ``kind`` ``"query"`` or ``"document"``."""
        torch = self.torch
        tower = self.model.query if kind == "query" else self.model.document
        modality = self.query_kind if kind == "query" else "text"
        self.model.eval()
        rows = []
        with torch.no_grad():
            for start in range(0, len(items), batch_size):
                e = self._side(tower, items[start:start + batch_size], modality)
                rows.append(torch.nn.functional.normalize(e, dim=1).cpu().numpy())
        return np.concatenate(rows).astype(np.float32)
