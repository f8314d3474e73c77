"""Files written whole or not at all, and the bytes of float32 arrays as both trainers' checkpoints
store and hash them."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile

import numpy as np

from .errors import ErrorCode, UFormError, UFormOSError


def float32_le_bytes(array: np.ndarray) -> memoryview:
    """An array's values as little-endian float32 bytes, without a copy when it is already one."""
    return memoryview(np.ascontiguousarray(array, dtype="<f4")).cast("B")


def _umask() -> int:
    """The process umask: read from /proc where Linux shows it, else set and put back."""
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove_abandoned(path: str) -> None:
    """Remove the temporary files beside path that writers killed mid-save left behind (their process is gone)."""
    folder, name = os.path.split(path)
    pattern = re.compile(rf"\.{re.escape(name)}\.(\d+)\.[^.]+\.tmp")
    for entry in os.listdir(folder):
        match = pattern.fullmatch(entry)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def bounded_lines(file, limit: int, error=lambda message: UFormError(ErrorCode.INVALID_ARGUMENT, message)):
    """A binary file's lines (without their newline), read one at a time; a line longer than `limit` bytes (a file
    of no newlines: /dev/zero) is refused after `limit` of it are read, never read whole: `error(message)`, the
    message naming the file and the line."""
    number = 0
    while raw := file.readline(limit + 1):
        number += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise error(f"{file.name}:{number}: a line longer than {limit} bytes")
        yield raw.removesuffix(b"\n")


def write_atomically(path, chunks) -> None:
    """Write the byte chunks to a temporary file beside path, sync it, then rename it over path: a reader
    sees the old file or the whole new one, and a failure leaves no temporary file behind (nor, once this
    save succeeds, any that a killed save of the same path left). The file takes the mode the umask gives
    a new file (0666 less the umask). A path that is a symbolic link is written through: its target is
    replaced, the link stays. An error names path, never the temporary file."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"path: a str, bytes or os.PathLike, got {type(path).__name__}")
    given = os.path.abspath(os.fsdecode(path))
    path = os.path.realpath(given)
    try:
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path),
                                             prefix=f".{os.path.basename(path)}.{os.getpid()}.", suffix=".tmp")
    except OSError as error:
        raise UFormOSError(ErrorCode.INVALID_ARGUMENT, f"{given}: cannot write: {error.strerror}") from None
    try:
        os.fchmod(handle, 0o666 & ~_umask())
        with os.fdopen(handle, "wb") as file:
            for chunk in chunks:
                file.write(chunk)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise UFormOSError(ErrorCode.INVALID_ARGUMENT, f"{given}: cannot write: {error.strerror}") from None
        raise
    _remove_abandoned(path)
