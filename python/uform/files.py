"""Files written whole or not at all, for both trainers' checkpoints."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomically(path, chunks) -> None:
    """Write the byte chunks to a temporary file beside path, sync it, then rename it over path: a reader
    sees the old file or the whole new one, and a failure leaves no temporary file behind."""
    path = os.fsdecode(path)
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                                         prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            for chunk in chunks:
                file.write(chunk)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
