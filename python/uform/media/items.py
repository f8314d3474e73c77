"""What a media item may be, how a refusal names it, and the normalised target its tokens reconstruct.

A media item is either the bytes of an encoded file (``bytes``, ``bytearray`` or
``memoryview``) or an already decoded ``numpy.uint8`` array. Every refusal is a
``UFormError(ErrorCode.INVALID_ARGUMENT, "item 3: ...")``: the item is not what
its modality promises, and the message names the item's index in the step and
the problem, so a caller can find the bad file without reading the library.
"""

from __future__ import annotations

import numpy as np

from ..errors import ErrorCode, UFormError
from .formats import describe_format, sniff_format


TARGET_EPSILON = 1e-6
"""Added to a token's variance before the square root of its normalised target."""


def normalised_targets(values: np.ndarray) -> np.ndarray:
    """MAE's reconstruction target of each row of float64 ``values`` (a patch, tube or frame): its values
    less their mean, over the square root of their variance plus TARGET_EPSILON, in float64, then float32."""
    mean = values.mean(axis=1, keepdims=True)
    variance = values.var(axis=1, keepdims=True)
    return ((values - mean) / np.sqrt(variance + TARGET_EPSILON)).astype(np.float32)


def item_error(item: int, message: str) -> UFormError:
    """The refusal of item ``item``: ``INVALID_ARGUMENT`` with ``"item {item}: {message}"``."""
    return UFormError(ErrorCode.INVALID_ARGUMENT, f"item {item}: {message}")


def encoded_format(content, item: int, modality: str, allowed: tuple[str, ...],
                   allowed_words: str) -> tuple[bytes, str]:
    """``(bytes, format)`` of an encoded item whose signature is one of ``allowed``; refuses anything else.

    ``modality`` ("IMAGE") and ``allowed_words`` ("JPEG, PNG or WebP") word the refusal.
    """
    if not isinstance(content, (bytes, bytearray, memoryview)):
        raise item_error(item, f"{modality} items are bytes or a uint8 array, got {type(content).__name__}")
    data = bytes(content)
    found = sniff_format(data)
    if found not in allowed:
        seen = f"bytes starting {data[:12]!r}" if found is None else describe_format(found)
        raise item_error(item, f"{seen}; {modality} items hold {allowed_words} files")
    return data, found


def uint8_array(content: np.ndarray, item: int, rank: int, layout: str, channels: tuple[int, ...]) -> np.ndarray:
    """``content`` checked to be a uint8 array of ``rank`` axes, none empty, its last one of ``channels``.

    ``layout`` names the axes in the refusal ("(H, W, C)").
    """
    if content.dtype != np.uint8:
        raise item_error(item, f"a decoded item is a uint8 array, got dtype {content.dtype}")
    if content.ndim != rank:
        raise item_error(item, f"a decoded item is shaped {layout}, got {content.ndim} axes {content.shape}")
    if content.shape[-1] not in channels:
        raise item_error(item, f"{content.shape[-1]} channels in {content.shape}; {layout} takes "
                               f"{', '.join(map(str, channels))}")
    if 0 in content.shape:
        raise item_error(item, f"an empty array {content.shape}")
    return content
