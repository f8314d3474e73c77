"""``MeshOptions``: where and how one process joins a run, and :func:`checked_options`, its one door.

The seeds name four fields (``host_domain_index``, ``host_domain_count``, ``directory``, ``job``) and let a
binding's defaults fill the rest (``..MeshOptions::default()`` in Rust); this project adds one,
``timeout_seconds``. As in every config, a field left out is zero and derives:

- ``host_domain_index``: this process's place, 0 .. host_domain_count - 1 (zero is host domain 0, a value).
- ``host_domain_count``: processes in the run, one per host domain; zero derives 1, a process alone.
- ``directory``: the shared directory the processes meet through, as ``os.fsencode`` gives its bytes; needed
  when host_domain_count > 1 (a run alone writes no file).
- ``job``: the run's name, a ``str``: the subdirectory of ``directory`` its files live in; needed when
  host_domain_count > 1. Letters, digits, ``.``, ``_`` and ``-``, at most 100, not starting with ``.``.
- ``timeout_seconds``: how long the rendezvous waits for every process, and each collective for every peer,
  before it raises PEER_LOST; zero derives DEFAULT_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, replace

from ..errors import ErrorCode, UFormError

DEFAULT_TIMEOUT_SECONDS = 300.0
"""A rendezvous or collective waits this long for its peers unless ``timeout_seconds`` says otherwise: room for
hosts that start minutes apart, and for a slow host's step."""
JOB_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
"""A job name: one path component that no file system reads as special."""


@dataclass(frozen=True, kw_only=True)
class MeshOptions:
    """How one process joins a mesh: its place among the run's processes and where they meet."""

    host_domain_index: int = 0
    """This process's host domain, 0 .. host_domain_count - 1."""
    host_domain_count: int = 0
    """The run's processes, one per host domain; zero derives 1."""
    directory: bytes | str | os.PathLike = b""
    """The directory every process reaches (shared storage); needed for several host domains."""
    job: str = ""
    """The run's name, the subdirectory of ``directory`` its files live in; needed for several host domains."""
    timeout_seconds: float = 0.0
    """Seconds a rendezvous or collective waits for its peers before PEER_LOST; zero derives 300."""

    @classmethod
    def from_environment(cls, directory: bytes | str | os.PathLike = b"", *, job: str = "",
                         timeout_seconds: float = 0.0, environ=None) -> MeshOptions:
        """This process's options from its launcher's variables (``environ``; default ``os.environ``), as
        PyTorch's ``init_process_group`` reads them: torchrun's ``RANK`` and ``WORLD_SIZE`` first (torchrun under
        Slurm sets both), else Slurm's ``SLURM_PROCID`` and ``SLURM_NTASKS``, else a process alone. The job is
        ``job`` if given, else ``slurm-$SLURM_JOB_ID`` or ``torchrun-$TORCHELASTIC_RUN_ID`` (torchrun's
        ``--rdzv-id``). A variable that is not a count, or one of a pair without the other, is INVALID_ARGUMENT
        naming it; the result still passes the one door (``checked_options``) where the mesh is made."""
        environ = os.environ if environ is None else environ
        index, count = _launcher_place(environ)
        if not job:
            if environ.get("SLURM_JOB_ID"):
                job = f"slurm-{environ['SLURM_JOB_ID']}"
            elif environ.get("TORCHELASTIC_RUN_ID", "none") != "none":
                job = f"torchrun-{environ['TORCHELASTIC_RUN_ID']}"
        return cls(host_domain_index=index, host_domain_count=count, directory=directory, job=job,
                   timeout_seconds=timeout_seconds)

    @staticmethod
    def local_index_from_environment(environ=None) -> int:
        """This process's index among its host's processes: torchrun's ``LOCAL_RANK``, else Slurm's
        ``SLURM_LOCALID``, else 0; the GPU a process of one GPU takes (``Executor.for_vram(devices=[i])``)."""
        environ = os.environ if environ is None else environ
        for name in ("LOCAL_RANK", "SLURM_LOCALID"):
            if name in environ:
                return _variable(environ, name)
        return 0


def _variable(environ, name: str) -> int:
    """The non-negative integer in variable `name`, or INVALID_ARGUMENT naming it."""
    text = environ[name].strip()
    if not text.isdigit():
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"MeshOptions.from_environment: {name}={environ[name]!r} is "
                                                     "not a non-negative integer")
    return int(text)


def _launcher_place(environ) -> tuple[int, int]:
    """(host domain index, count) from torchrun's variables, else Slurm's, else (0, 1)."""
    for index_name, count_name in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        present = [name for name in (index_name, count_name) if name in environ]
        if len(present) == 1:
            missing = count_name if present[0] == index_name else index_name
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"MeshOptions.from_environment: {present[0]} is set "
                                                         f"without {missing}; a launcher sets both")
        if present:
            return _variable(environ, index_name), _variable(environ, count_name)
    return 0, 1


def _invalid(field: str, message: str) -> UFormError:
    return UFormError(ErrorCode.INVALID_ARGUMENT, f"MeshOptions.{field}: {message}")


def _integer(field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise _invalid(field, f"must be a non-negative integer, got {value!r}")
    return int(value)


MAX_HOST_DOMAINS = 65536
"""The most processes a mesh joins (the rendezvous reads a file of each)."""
MAX_TIMEOUT_SECONDS = 1e7
"""The longest wait an option may ask (about 116 days; the backends' timers hold it)."""


def shown(path: bytes) -> str:
    """A path for a message: its bytes decoded, those that are not UTF-8 as backslash escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def checked_options(options) -> MeshOptions:
    """The options with every zero derived and the directory as bytes, or INVALID_ARGUMENT naming the field."""
    if not isinstance(options, MeshOptions):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"options: expected uform.MeshOptions, got "
                                                     f"{type(options).__name__}")
    count = _integer("host_domain_count", options.host_domain_count) or 1
    if count > MAX_HOST_DOMAINS:
        raise _invalid("host_domain_count", f"{count} passes the {MAX_HOST_DOMAINS} host domains a mesh joins")
    index = _integer("host_domain_index", options.host_domain_index)
    if index >= count:
        raise _invalid("host_domain_index", f"{index} is not below host_domain_count {count}")
    timeout = options.timeout_seconds
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not math.isfinite(timeout) or timeout < 0:
        raise _invalid("timeout_seconds", f"must be a finite number of seconds >= 0, got {timeout!r}")
    if timeout > MAX_TIMEOUT_SECONDS:
        raise _invalid("timeout_seconds", f"{timeout!r} passes the longest wait, {MAX_TIMEOUT_SECONDS:g} s")
    try:
        directory = os.fsencode(options.directory)
    except TypeError:
        raise _invalid("directory", f"must be a path (bytes, str or os.PathLike), got "
                                    f"{type(options.directory).__name__}") from None
    if not isinstance(options.job, str):
        raise _invalid("job", f"must be a str, got {type(options.job).__name__}")
    if options.job and not JOB_NAME.fullmatch(options.job):
        raise _invalid("job", f"{options.job!r} is not a job name (letters, digits, '.', '_' and '-', at most 100, "
                              "not starting with '.')")
    if count > 1:
        if not directory:
            raise _invalid("directory", f"a mesh of {count} host domains meets through a shared directory; none given")
        if not options.job:
            raise _invalid("job", f"a mesh of {count} host domains needs a job name; none given")
        if not os.path.isdir(directory):
            raise _invalid("directory", f"{shown(directory)} is not a directory")
        try:
            directory.decode()
        except UnicodeDecodeError:
            raise _invalid("directory", f"{shown(directory)} is not UTF-8: gloo's store takes a text path") from None
    return replace(options, host_domain_index=index, host_domain_count=count, directory=directory,
                   timeout_seconds=float(timeout) or DEFAULT_TIMEOUT_SECONDS)
