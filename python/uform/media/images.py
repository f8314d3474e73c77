"""Decoding one IMAGE item to pixels: RGBA (or RGB) uint8, at the file's own resolution.

An IMAGE item is the bytes of a JPEG, PNG or WebP file, or an already decoded
``numpy.uint8`` array shaped ``(H, W, C)`` with ``C`` 1 (gray), 3 (RGB) or 4 (RGBA).
:func:`decode_image` answers ``(H, W, channels)`` uint8 pixels:

- ``channels`` 4 (``ImageShape.channels``' default) is RGBA: an image without alpha
  gets an opaque 255, a gray one is copied into R, G and B. ``channels`` 3 is RGB,
  alpha dropped (not composited over any background).
- Files decode with Pillow restricted to the format their signature names
  (:mod:`.formats`), converted by Pillow's ``convert("RGBA")`` -- which resolves
  palettes and their transparency, CMYK and gray+alpha -- except 16-bit gray
  (Pillow's ``I;16`` modes), whose high byte is the 8-bit gray, where Pillow would
  clip. An EXIF orientation tag is applied (``ImageOps.exif_transpose``), so the
  pixels stand as the camera meant. An animated WebP or PNG gives its first frame.
- **Decompression bombs.** The width and height in the file's header are read
  before any pixel is decoded; an image of more than ``max_pixels`` pixels
  (:data:`MAX_IMAGE_PIXELS` by default) is refused without decoding it. Pillow's own
  check at open still applies beyond that (it warns past ``Image.MAX_IMAGE_PIXELS``
  and refuses past twice that). Arrays are already in memory and are not limited.

Refusals (``INVALID_ARGUMENT``, naming the item; see :mod:`.items`): bytes that are
not a JPEG, PNG or WebP file (a video, a GIF, unrecognised bytes), a header Pillow
cannot read (corrupt, truncated, or of zero width or height, which Pillow refuses
at open), a body it cannot decode (corrupt or truncated), too many pixels, and an
array that is not uint8, not three axes, empty, or of another channel count.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

from ..errors import ErrorCode, UFormError
from .formats import IMAGE_FORMATS
from .items import encoded_format, item_error, uint8_array

MAX_IMAGE_PIXELS = 1 << 25
"""The default limit on width times height of one encoded image: 33,554,432 pixels (8192 × 4096)."""
IMAGE_CHANNELS = (3, 4)
"""The channel counts images decode to: RGB and RGBA."""


def _check_channels(channels: int) -> None:
    if channels not in IMAGE_CHANNELS:
        raise UFormError(ErrorCode.UNSUPPORTED,
                         f"channels: images decode to 4 (RGBA) or 3 (RGB) channels, got {channels}")


def _with_alpha(pixels: np.ndarray) -> np.ndarray:
    """``(H, W, 1|3|4)`` uint8 as ``(H, W, 4)`` RGBA: gray copied to R, G, B; missing alpha 255."""
    if pixels.shape[-1] == 4:
        return np.ascontiguousarray(pixels)
    height, width, _ = pixels.shape
    rgba = np.empty((height, width, 4), np.uint8)
    rgba[..., :3] = pixels
    rgba[..., 3] = 255
    return rgba


def _decode_file(data: bytes, form: str, item: int, max_pixels: int) -> np.ndarray:
    """The RGBA pixels of an encoded image of format ``form``, after the header checks of the module doc."""
    try:
        image = Image.open(io.BytesIO(data), formats=[form])
    except Image.DecompressionBombError as error:
        raise item_error(item, f"past Pillow's own limit: {error}") from None
    except Exception:
        raise item_error(item, f"an unreadable {form} header (corrupt, truncated or zero-size)") from None
    width, height = image.size
    if width * height > max_pixels:
        raise item_error(item, f"{width} × {height} = {width * height} pixels, past the limit of {max_pixels} "
                               f"(a decompression bomb?)")
    try:
        image.load()
        image = ImageOps.exif_transpose(image)
        if image.mode.startswith("I;16"):
            return _with_alpha((np.asarray(image) >> 8).astype(np.uint8)[..., None])
        return np.asarray(image.convert("RGBA"))
    except Exception as error:
        raise item_error(item, f"a corrupt or truncated {form} image: {error}") from None


def decode_image(content, item: int = 0, *, channels: int = 4, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """``(H, W, channels)`` uint8 pixels of one IMAGE item; see the module doc.

    ``item`` is the item's index in the step, named by every refusal. ``channels``
    is 4 (RGBA) or 3 (RGB); another count is ``UNSUPPORTED``.
    """
    _check_channels(channels)
    if isinstance(content, np.ndarray):
        rgba = _with_alpha(uint8_array(content, item, 3, "(H, W, C)", (1, 3, 4)))
    else:
        data, form = encoded_format(content, item, "IMAGE", IMAGE_FORMATS, "JPEG, PNG or WebP")
        rgba = _decode_file(data, form, item, max_pixels)
    return rgba if channels == 4 else np.ascontiguousarray(rgba[..., :3])
