"""Tokens into the transformer stack and scores out of it, shared by both models.

``TokenInputs`` holds one batch's ids, positions and attention spans on the device and runs the
embedding forward and backward; ``CrossEntropyHead`` is a linear head scored by cross-entropy
(the language model's next-byte head, the encoder's masked-byte head).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import kernels as K
from .. import layouts
from ..engine import Buffer, Device


@dataclass
class TokenInputs:
    """n tokens on the device: ids, positions, attention spans (layouts.attention_spans) with room after them for
    attention's tile table (write_spans), and the order and offsets that group tokens by id for the embedding
    backward (with fast mode's chunks of the groups: layouts.embedding_chunks)."""

    ids: Buffer
    positions: Buffer
    spans: Buffer
    spans_and_tiles: Buffer  # the allocation spans views: (2n, 2), the tile table after the spans
    order: Buffer
    offsets: Buffer
    chunk_starts: Buffer
    id_chunks: Buffer

    @classmethod
    def allocate(cls, device: Device, n: int, vocabulary: int, position_axes: int = 1, rows: int = 1, *,
                 ids: Buffer | None = None) -> TokenInputs:
        """Buffers for n tokens; positions (n,), or (n, position_axes) for rotary positions on several axes;
        `rows`: the packed rows the embedding backward groups by (offsets for rows × vocabulary groups). ids: a
        buffer to take instead of a new one (a view of an upload it shares with other inputs)."""
        positions = device.empty(n if position_axes == 1 else (n, position_axes), np.int32)
        spans_and_tiles = device.empty((2 * n, 2), np.int32)  # a tile table has at most n tiles
        return cls(ids=device.empty(n, np.int32) if ids is None else ids, positions=positions,
                   spans=spans_and_tiles.view(0, (n, 2)), spans_and_tiles=spans_and_tiles,
                   order=device.empty(n, np.int32),
                   offsets=device.empty(rows * vocabulary + 1, np.int32),
                   chunk_starts=device.empty(-(-n // K.EMBEDDING_CHUNK) + vocabulary + 1, np.int32),
                   id_chunks=device.empty(vocabulary + 1, np.int32))

    def write_spans(self, spans: np.ndarray, tiles: np.ndarray) -> Buffer:
        """Upload the spans and attention's tile table for them (layouts.attention_tiles) in one copy, the table
        right after the spans, where the attention kernels read it; answers the table's buffer."""
        both = np.concatenate([spans.reshape(-1), tiles.reshape(-1)])
        self.spans_and_tiles.view(0, both.size).write(both)
        return self.spans_and_tiles.view(spans.size, tiles.shape)

    def embed(self, out: Buffer, table: Buffer, rows: Buffer | None = None, row_of: Buffer | None = None) -> None:
        """out = table[ids], the rows of the embedding table, plus rows[row_of] where row_of ≥ 0 if given
        (the media tokens' patch embeddings)."""
        K.embedding_forward(out, table, self.ids, table.shape[1], rows=rows, row_of=row_of)

    def embedding_backward(self, dtable: Buffer, d_out: Buffer, ids: np.ndarray, *, row_length: int = 0,
                           partials: Buffer | None = None, fast: bool = False) -> None:
        """The embedding table's gradient from the gradient at its output; `ids` are the host copy of
        the ids, grouped on the host. row_length > 0: each packed row of row_length tokens sums alone into
        `partials` [rows, vocabulary, width], the rows then combined by the row tree (docs/mesh.md). fast: fast
        mode's order instead, the groups summed in chunks (kernels.embedding_backward_chunked)."""
        vocabulary, width = dtable.shape
        if not fast:
            grouped = self.write_groups(ids, vocabulary, row_length)
            K.embedding_backward(dtable, d_out, self.order, grouped, width, partials=partials)
            return
        order, offsets = layouts.embedding_groups(ids, vocabulary)
        self.order.write(order)
        chunk_starts, id_chunks = layouts.embedding_chunks(offsets)
        starts = self.chunk_starts.view(0, chunk_starts.size)
        starts.write(chunk_starts)
        self.id_chunks.write(id_chunks)
        K.embedding_backward_chunked(dtable, d_out, self.order, starts, self.id_chunks, width)

    def write_groups(self, ids: np.ndarray, vocabulary: int, row_length: int = 0) -> Buffer:
        """Group the tokens by id on the host (by packed row and id with row_length: ``layouts.embedding_groups``)
        into order and offsets, for the identical embedding backward; answers the offsets written (the first
        entries of the buffer, which is sized for the most rows)."""
        order, offsets = layouts.embedding_groups(ids, vocabulary, row_length)
        self.order.write(order)
        grouped = self.offsets.view(0, offsets.size)
        grouped.write(offsets)
        return grouped


@dataclass
class CrossEntropyHead:
    """A linear head over n tokens scored by cross-entropy: logits = x·weight ([width, vocabulary]),
    one loss per token against its target (a target < 0 is ignored)."""

    targets: Buffer
    logits: Buffer
    dlogits: Buffer
    losses: Buffer

    @classmethod
    def allocate(cls, device: Device, n: int, vocabulary: int, *, losses: Buffer | None = None,
                 targets: Buffer | None = None) -> CrossEntropyHead:
        """losses: where the losses go, if not a buffer of their own (a view at the start of a larger one, which
        a single download then reads with what follows them); targets likewise (a view of a larger upload)."""
        return cls(targets=device.empty(n, np.int32) if targets is None else targets,
                   logits=device.empty((n, vocabulary)),
                   dlogits=device.empty((n, vocabulary)), losses=device.empty(n) if losses is None else losses)

    def forward(self, x: Buffer, weight: Buffer) -> None:
        n, vocabulary = self.logits.shape
        K.gemm(self.logits, x, weight, n, vocabulary, weight.shape[0])

    def score(self, targets: np.ndarray, *, grad_scale: float, with_gradient: bool) -> None:
        """Each token's loss; with_gradient also dlogits, the gradient of grad_scale·Σ losses."""
        self.targets.write(targets.reshape(-1))
        self.cross_entropy(grad_scale=grad_scale, with_gradient=with_gradient)

    def cross_entropy(self, *, grad_scale: float, with_gradient: bool) -> None:
        """score's launch, on the targets the buffer holds."""
        K.cross_entropy(self.losses, self.dlogits if with_gradient else None, self.logits, self.targets,
                        grad_scale=grad_scale)

    def backward(self, dweight: Buffer, dx: Buffer, x: Buffer, weight: Buffer, *, row_length: int = 0) -> None:
        """The weight's gradient and the gradient at x (both overwritten), from dlogits; row_length > 0 sums the
        weight's gradient by packed rows (``kernels.gemm``'s k_range)."""
        n, vocabulary = self.logits.shape
        width = weight.shape[0]
        K.gemm(dweight, x, self.dlogits, width, vocabulary, n, transpose_a=True, k_range=row_length)
        K.gemm(dx, self.dlogits, weight, n, width, vocabulary, transpose_b=True)
