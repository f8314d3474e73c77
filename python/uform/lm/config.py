"""Dimensions and parameter layout of the decoder-only byte language model.

The model keeps all of its parameters in one flat float32 vector. Each tensor
occupies a contiguous, row-major slice of it, in the order listed by
:func:`parameter_registry`; a linear layer computes ``y = x @ W`` with ``W`` of
shape ``[in, out]``::

    embedding                 [vocab_size, width]
    for i in range(layers):
      layers.{i}.attention_norm [width]
      layers.{i}.wq             [width, heads * head_dim]
      layers.{i}.wk             [width, kv_heads * head_dim]
      layers.{i}.wv             [width, kv_heads * head_dim]
      layers.{i}.wo             [heads * head_dim, width]
      layers.{i}.mlp_norm       [width]
      layers.{i}.w_up           [width, mlp]
      layers.{i}.w_down         [mlp, width]
    head                      [width, vocab_size]
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass

import numpy as np

from ..nn.resident import named_tensors, registry_size, tensor_registry
from ..nn.transformer import StackGeometry
from ..errors import type_error, value_error

_INT_FIELDS = ("batch", "length", "width", "heads", "kv_heads", "mlp", "vocab_size", "layers")
_FLOAT_FIELDS = ("rope_base", "norm_eps")


@dataclass(frozen=True, kw_only=True)
class LanguageModelConfig:
    """Model and batch dimensions; every field is positive.

    ``width`` must divide into ``heads`` heads of an even ``head_dim`` (rotary
    embeddings rotate pairs), and ``heads`` must be a multiple of ``kv_heads``
    (grouped-query attention: query head ``h`` reads key/value head
    ``h // (heads // kv_heads)``). A field that breaks these rules raises
    :class:`ValueError` naming it.
    """

    batch: int = 2
    length: int = 32
    width: int = 32
    heads: int = 4
    kv_heads: int = 2
    mlp: int = 64
    vocab_size: int = 256
    layers: int = 2
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool):
                raise value_error(f"{name} must be an integer, got {value!r}")
            try:
                value = operator.index(value)
            except TypeError:
                raise value_error(f"{name} must be an integer, got {value!r}") from None
            if value <= 0:
                raise value_error(f"{name} must be positive, got {value}")
            object.__setattr__(self, name, value)
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise value_error(f"{name} must be a number, got {value!r}")
            value = float(value)
            if not (math.isfinite(value) and np.finfo(np.float32).tiny <= value <= np.finfo(np.float32).max):
                raise value_error(f"{name} must be a positive, normal float32 (the engine computes in float32), "
                                  f"got {value}")
            object.__setattr__(self, name, value)
        if self.width % self.heads:
            raise value_error(f"width ({self.width}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise value_error(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise value_error(f"head_dim = width // heads = {self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        """Width of one attention head, ``width // heads``."""
        return self.width // self.heads

    @property
    def n_total(self) -> int:
        """Number of values in the flat parameter vector."""
        return registry_size(parameter_registry(self))

    def stack(self) -> StackGeometry:
        """The geometry of the model's causal, grouped-query transformer stack."""
        return StackGeometry(width=self.width, heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
                             mlp=self.mlp, layers=self.layers, norm_eps=self.norm_eps, rope_base=self.rope_base,
                             causal=True)

    def to_dict(self) -> dict:
        """The fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> "LanguageModelConfig":
        """Inverse of :meth:`to_dict`; a missing or unknown field raises ValueError."""
        if not isinstance(fields, dict):
            raise value_error(f"config must be a dict, got {type(fields).__name__}")
        expected = {f.name for f in dataclasses.fields(cls)}
        missing, extra = expected - fields.keys(), fields.keys() - expected
        if missing or extra:
            raise value_error(f"config fields do not match LanguageModelConfig: "
                              f"missing {sorted(missing)}, unknown {sorted(map(str, extra))}")
        return cls(**fields)


def _config(shape: LanguageModelConfig | None) -> LanguageModelConfig:
    if shape is None:
        return LanguageModelConfig()
    if not isinstance(shape, LanguageModelConfig):
        raise type_error(f"shape must be a LanguageModelConfig or None, got {type(shape).__name__}")
    return shape


def parameter_registry(shape: LanguageModelConfig | None = None) -> list[dict]:
    """Name, shape, offset and size of every parameter tensor, in flat order.

    Returns one ``{"name", "shape", "offset", "size"}`` dict per tensor; the
    offsets are contiguous, so the last ``offset + size`` is ``shape.n_total``.
    """
    c = _config(shape)
    return tensor_registry([("embedding", (c.vocab_size, c.width)), *c.stack().tensor_shapes(),
                            ("head", (c.width, c.vocab_size))])


def split_parameters(flat, shape: LanguageModelConfig | None = None) -> dict[str, np.ndarray]:
    """Named views into a flat parameter vector of ``shape.n_total`` values.

    The views share memory with ``flat`` when it is already a 1-D numpy array,
    so writing to them writes to it.
    """
    registry = parameter_registry(_config(shape))
    flat = np.asarray(flat)
    n_total = registry_size(registry)
    if flat.shape != (n_total,):
        raise value_error(f"flat parameters must have shape ({n_total},), got {flat.shape}")
    return named_tensors(flat, registry)


def flatten_parameters(named: dict, shape: LanguageModelConfig | None = None) -> np.ndarray:
    """Pack named tensors into a fresh flat float32 vector in registry order.

    Raises ValueError for a missing or unknown name, or a tensor whose shape
    differs from the registry's.
    """
    registry = parameter_registry(_config(shape))
    if not isinstance(named, dict):
        raise type_error(f"named parameters must be a dict, got {type(named).__name__}")
    expected = [r["name"] for r in registry]
    missing = [n for n in expected if n not in named]
    extra = sorted(map(str, named.keys() - set(expected)))
    if missing or extra:
        raise value_error(f"parameter names do not match the registry: missing {missing}, unknown {extra}")
    flat = np.empty(registry_size(registry), dtype=np.float32)
    for r in registry:
        tensor = np.asarray(named[r["name"]])
        if tensor.shape != r["shape"]:
            raise value_error(f"parameter {r['name']!r} must have shape {r['shape']}, got {tensor.shape}")
        flat[r["offset"]:r["offset"] + r["size"]] = tensor.reshape(-1)
    return flat
