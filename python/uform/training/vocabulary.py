"""Token ids of the byte-level text tower.

Text is UTF-8 bytes, a byte per token (``Modality.TEXT``), so ids ``0..255`` are
the bytes themselves and need no tokenizer. Two special ids follow the bytes:

- ``PAD`` (256) fills the positions of a row no segment covers; no loss reads it.
- ``MASK`` (257) stands in for a covered byte the masked objective hides.

Keeping them past 255 means no real byte is ever mistaken for padding or a mask,
whatever the text holds. The embedding table and output head span
``VOCABULARY_SIZE`` rows: the 258 text ids, padded to a multiple of 8 so the
head's GEMM tiles evenly. The six rows past them are the media tokens' rows:
for each of image, video and audio, a *modality* id (a patch's input is its
patch embedding plus this row) and a *mask* id (the learned embedding shown in
place of a hidden patch). They are never targets of the byte head (its targets
are bytes, ``0..255``), and a text-only run never reads them.
"""

from __future__ import annotations

BYTE_COUNT = 256
"""Ids ``0..255``: the bytes of UTF-8 text."""
PAD = 256
"""The id of a position no segment covers."""
MASK = 257
"""The id shown in place of a covered byte."""
TOKEN_COUNT = 258
"""Ids in use: the bytes, then ``PAD`` and ``MASK``."""
VOCABULARY_SIZE = 264
"""Rows of the embedding table and output head: ``TOKEN_COUNT`` padded to a multiple of 8."""
IMAGE_TOKEN, IMAGE_MASK = 258, 259
"""The ids of an image patch (added to its patch embedding) and of a hidden image patch."""
VIDEO_TOKEN, VIDEO_MASK = 260, 261
"""The ids of a video tube and of a hidden one."""
AUDIO_TOKEN, AUDIO_MASK = 262, 263
"""The ids of an audio frame and of a hidden one."""
IGNORED_TARGET = -1
"""The target of a position no loss reads: not covered by a span, or padding."""
