"""Telling a file's format from its first bytes, so a mislabelled item is named before decoding.

A training item's modality says what its bytes hold (``Modality.IMAGE``: a JPEG,
PNG or WebP file; ``Modality.VIDEO``: an MP4 or WebM file). :func:`sniff_format`
reads the signature every one of these formats opens with, and those of the
formats most often confused with them, so a decoder can refuse "a PNG image, not
a video" instead of a decoder's own message about a bad header:

================  =================================================================
``"JPEG"``        ``FF D8 FF``
``"PNG"``         ``89 50 4E 47 0D 0A 1A 0A``
``"WEBP"``        ``RIFF`` .... ``WEBP``
``"GIF"``         ``GIF87a`` or ``GIF89a``
``"BMP"``         ``BM``
``"TIFF"``        ``II*\\0`` or ``MM\\0*``
``"AVI"``         ``RIFF`` .... ``AVI ``
``"MP4"``         an ISO base media ``ftyp`` box at offset 4 with any major brand but
                  QuickTime's and the HEIF/AVIF image brands
``"QUICKTIME"``   ``ftyp`` with major brand ``qt  ``
``"HEIF"``        ``ftyp`` with major brand ``heic``, ``heix``, ``mif1``, ``msf1`` or ``avif``
``"WEBM"``        an EBML header (``1A 45 DF A3``) whose DocType is ``webm``
``"MATROSKA"``    an EBML header whose DocType is ``matroska``
``"OGG"``         ``OggS``
================  =================================================================

Anything else is ``None``. A signature says what a file claims to be, not that
the rest of it is sound: decoding finds the corrupt and the truncated.
"""

from __future__ import annotations

IMAGE_FORMATS = ("JPEG", "PNG", "WEBP")
"""The formats a ``Modality.IMAGE`` item may hold."""
VIDEO_FORMATS = ("MP4", "WEBM")
"""The formats a ``Modality.VIDEO`` item may hold."""

_HEIF_BRANDS = (b"heic", b"heix", b"mif1", b"msf1", b"avif")
_EBML_MAGIC = b"\x1a\x45\xdf\xa3"
_EBML_HEADER_SPAN = 64
"""Bytes searched for the DocType: an EBML header is a few dozen bytes long."""


def _iso_media_format(brand: bytes) -> str:
    if brand == b"qt  ":
        return "QUICKTIME"
    return "HEIF" if brand in _HEIF_BRANDS else "MP4"


def sniff_format(content: bytes) -> str | None:
    """The format ``content`` opens with, as the module doc's table names it; None for none of them."""
    head = bytes(content[:_EBML_HEADER_SPAN])
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"RIFF") and head[8:12] in (b"WEBP", b"AVI "):
        return "WEBP" if head[8:12] == b"WEBP" else "AVI"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if head.startswith(b"BM"):
        return "BMP"
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return "TIFF"
    if head[4:8] == b"ftyp":
        return _iso_media_format(head[8:12])
    if head.startswith(_EBML_MAGIC):
        if b"webm" in head:
            return "WEBM"
        return "MATROSKA" if b"matroska" in head else None
    if head.startswith(b"OggS"):
        return "OGG"
    return None


_DESCRIPTIONS = {
    "JPEG": "a JPEG image", "PNG": "a PNG image", "WEBP": "a WebP image", "GIF": "a GIF image",
    "BMP": "a BMP image", "TIFF": "a TIFF image", "HEIF": "a HEIF/AVIF image", "AVI": "an AVI video",
    "MP4": "an MP4 video", "QUICKTIME": "a QuickTime video", "WEBM": "a WebM video",
    "MATROSKA": "a Matroska video", "OGG": "an Ogg file",
}


def describe_format(name: str) -> str:
    """A format :func:`sniff_format` names, as a refusal says it: "a PNG image", "an MP4 video"."""
    return _DESCRIPTIONS[name]
