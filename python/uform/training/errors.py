"""The one exception the training API raises, and the codes that classify it.

The C library reports failures as a ``uform_status_t`` code plus a message; the
Python binding raises :class:`UFormError` carrying the same two things. The
message always names what is at fault -- a config field
(``"contrastive.matryoshka_dimensions: ..."``), a per-item array and the item
(``"bags: 5 entries for 4 items"``), or an edge set and the item that lists the
bad edge (``"relations.attract: item 3 ..."``) -- so a caller can fix the input
without reading the library.

The numeric values are this package's own (zero is left for "no error"); code
compares against the names, never the numbers.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Why a call was refused."""

    INVALID_ARGUMENT = 1
    """A value is out of its documented range: a zero that cannot derive, a misordered list, a bad probability."""
    SHAPE_MISMATCH = 2
    """Arrays that must agree in length do not: a per-item array against the contents, weights against ids."""
    CONFIG_MISMATCH = 3
    """A checkpoint or peer describes another geometry than the run's."""
    UNSUPPORTED = 4
    """A valid request this build cannot serve yet, like an image item."""


class UFormError(Exception):
    """A refused call: ``code`` classifies it, the message names the field, item or edge at fault."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message

    def __repr__(self) -> str:
        return f"UFormError({self.code.name}, {self.message!r})"
