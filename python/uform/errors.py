"""The one exception uform raises for a refused call, and the codes that classify it.

Every package of uform raises :class:`UFormError` (or a subclass that is also the built-in type a caller
catches: ``ValueError``, ``TypeError``, ``RuntimeError``, ``OSError``), carrying a code and a message. The
message always names what is at fault -- a config field (``"contrastive.matryoshka_dimensions: ..."``), a
per-item array and the item (``"bags: 5 entries for 4 items"``), or an edge set and the item that lists the
bad edge (``"relations.attract: item 3 ..."``) -- so a caller can fix the input without reading the library.
It lives at the package's root because every layer raises it, the engine's gateway included.

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
    """A valid request this build cannot serve yet, like a mesh, or a GPU on a machine without one."""
    CORRUPTED = 5
    """A file fails its checksums or its structure: modified, truncated, or not a checkpoint at all."""
    DEVICE_LOST = 6
    """The engine failed mid-call; the state on the device is unknown until a state is loaded again."""
    PEER_LOST = 7
    """A process of the mesh never arrived, died, or did not answer within the mesh's timeout."""


class UFormError(Exception):
    """A refused call: ``code`` classifies it, the message names the field, item or edge at fault."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.name}, {self.message!r})"

    def __reduce__(self):
        # rebuilt from its code and message whatever a subclass's constructor takes, so that a refusal raised in a
        # decoding process (uform.media.pool) reaches the trainer as it was raised
        return _rebuilt, (type(self), int(self.code), self.message)


def _rebuilt(kind: type, code: int, message: str) -> UFormError:
    error = kind.__new__(kind)
    UFormError.__init__(error, ErrorCode(code), message)
    return error


class UFormValueError(UFormError, ValueError):
    """A UFormError that is also a ValueError: the language-model trainer keeps mojolearn's exception types."""


class UFormTypeError(UFormError, TypeError):
    """A UFormError that is also a TypeError (mojolearn's type for an argument of the wrong type)."""


class UFormRuntimeError(UFormError, RuntimeError):
    """A UFormError that is also a RuntimeError (mojolearn's type for a non-finite loss or a lost device)."""


class UFormOSError(UFormError, OSError):
    """A UFormError that is also an OSError: a file that cannot be read or written, named."""


def value_error(message: str, code: ErrorCode = ErrorCode.INVALID_ARGUMENT) -> UFormValueError:
    """The language-model side's refusal of a value (INVALID_ARGUMENT unless another code is given)."""
    return UFormValueError(code, message)


def type_error(message: str) -> UFormTypeError:
    """The language-model side's refusal of an argument of the wrong type."""
    return UFormTypeError(ErrorCode.INVALID_ARGUMENT, message)
