"""The rendezvous: one process per host domain meets the others through files in the mesh directory.

Everything lives under ``<directory>/<job>/``; every file is written whole (``files.write_atomically``), so a
reader sees nothing or all of it:

- ``open.json``: host domain 0 opens an *attempt*, a fresh random identifier, and names it here.
- ``<attempt>/host-<i>.json``: each process's *declaration*: its host domain, the run's size, its executor
  (kind, devices, GPU class), its timeout, and a random identifier of the process itself.
- ``<attempt>/roster.json``: host domain 0, once every declaration is in and they agree, lists them all; a
  process is admitted when the roster names its own process identifier.
- ``<attempt>/refused.json``: host domain 0 refuses the attempt instead (declarations that disagree, or peers
  that never arrived), naming the processes it had seen; each of those raises the same error.

Host domain 0 removes every other entry of the job's directory when it opens an attempt (a directory renamed
aside first, so that no writer races the removal): an older attempt's files (a crashed or finished run of the
same job) are cleaned, never joined. A process that read an older
``open.json`` before host domain 0 replaced it announces itself again in the new attempt; an older roster or
refusal does not name its process identifier, so it never admits or refuses it. Every wait ends at the
options' timeout with PEER_LOST naming who is missing; the backend's own rendezvous (gloo's FileStore, later
NCCL's unique id) goes in the attempt's directory after admission.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import time
from dataclasses import dataclass

from ..files import write_atomically
from ..training.errors import ErrorCode, UFormError, UFormOSError
from .collectives import peer_lost
from .options import MeshOptions

PROTOCOL = 1
"""The version of these files; a process of another version is refused."""
POLL_SECONDS = 0.05
"""How often a waiting process looks at the directory."""
COMPARED = ("protocol", "host_domain_count", "executor", "devices", "gpu_class", "timeout_seconds")
"""The declaration fields every process of a run must agree on."""


@dataclass(frozen=True)
class Roster:
    """An admitted attempt: its identifier and directory, and every process's declaration in host-domain order."""

    attempt: str
    directory: bytes
    members: list[dict]


def declaration(options: MeshOptions, *, executor: str, devices: int, gpu_class: str) -> dict:
    """This process's declaration, with a fresh process identifier."""
    return {"protocol": PROTOCOL, "host_domain_index": options.host_domain_index,
            "host_domain_count": options.host_domain_count, "executor": executor, "devices": devices,
            "gpu_class": gpu_class, "timeout_seconds": options.timeout_seconds, "process": secrets.token_hex(16),
            "host": socket.gethostname(), "pid": os.getpid()}


def _read(path: bytes) -> dict | None:
    """A file of the protocol, or None when it is not there (yet, or any more)."""
    try:
        with open(path, "rb") as file:
            text = file.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise UFormError(ErrorCode.CORRUPTED, f"mesh: {os.fsdecode(path)} is not a file of uform's mesh protocol")
    return value


def _write(path: bytes, value: dict) -> None:
    write_atomically(path, [json.dumps(value, sort_keys=True).encode()])


def _who(entry: dict) -> str:
    return f"pid {entry.get('pid')} on {entry.get('host')!r}"


def disagreement(members: list[dict]) -> str | None:
    """What the declarations disagree on, every field named with each host domain's value; None if nothing."""
    differing = []
    for field in COMPARED:
        values = [member.get(field) for member in members]
        if any(value != values[0] for value in values):
            differing.append(f"{field} (" + ", ".join(f"host domain {member['host_domain_index']}: {value!r}"
                                                       for member, value in zip(members, values)) + ")")
    return "; ".join(differing) or None


def rendezvous(options: MeshOptions, mine: dict) -> Roster:
    """Meet every other process of the job, or raise: PEER_LOST when one never arrives within the timeout,
    CONFIG_MISMATCH when the declarations disagree (on every process that declared)."""
    job = os.path.join(options.directory, os.fsencode(options.job))
    deadline = time.monotonic() + options.timeout_seconds
    if options.host_domain_index == 0:
        return _open_attempt(options, job, mine, deadline)
    return _join_attempt(options, job, mine, deadline)


def _open_attempt(options: MeshOptions, job: bytes, mine: dict, deadline: float) -> Roster:
    """Host domain 0: open a fresh attempt, clean older ones, wait for every declaration, admit or refuse."""
    attempt = secrets.token_hex(8)
    here = os.path.join(job, attempt.encode())
    try:
        os.makedirs(here)
    except OSError as error:
        raise UFormOSError(ErrorCode.INVALID_ARGUMENT, f"mesh: cannot create {os.fsdecode(here)}: "
                                                       f"{error.strerror}") from None
    opened = {"protocol": PROTOCOL, "attempt": attempt, "host": mine["host"], "pid": mine["pid"],
              "process": mine["process"]}
    _write(os.path.join(job, b"open.json"), opened)
    for entry in os.listdir(job):
        if entry not in (attempt.encode(), b"open.json") and not entry.startswith(b"."):
            _remove(os.path.join(job, entry))
    _write(os.path.join(here, b"host-0.json"), mine)
    count = options.host_domain_count
    while True:
        now_open = _read(os.path.join(job, b"open.json"))
        if now_open is None or now_open.get("process") != mine["process"]:
            raise UFormError(ErrorCode.CONFIG_MISMATCH, f"mesh: job {options.job!r} was opened again as host domain "
                             f"0 by {_who(now_open or {})} after this process ({_who(mine)}) opened it: two "
                             "processes claim host_domain_index 0, or another launch of the job started")
        members = [_read(os.path.join(here, f"host-{i}.json".encode())) for i in range(count)]
        problem = disagreement([member for member in members if member is not None])
        if problem is not None:
            error = UFormError(ErrorCode.CONFIG_MISMATCH, f"mesh: the processes of job {options.job!r} declare "
                                                          f"different meshes: {problem}")
            _refuse(here, members, error)
            raise error
        missing = [i for i, member in enumerate(members) if member is None]
        if not missing:
            break
        if time.monotonic() > deadline:
            error = peer_lost(_never_arrived(options, missing))
            _refuse(here, members, error)
            raise error
        time.sleep(POLL_SECONDS)
    _write(os.path.join(here, b"roster.json"), {"attempt": attempt, "members": members})
    return Roster(attempt, here, members)


def _remove(stale: bytes) -> None:
    """Remove an older attempt's entry. A directory is first renamed aside, atomically, so that a process still
    writing its declaration into it (it read the older open.json) fails to, rather than racing the removal."""
    if not os.path.isdir(stale):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
        return
    aside = os.path.join(os.path.dirname(stale), f"removed-{secrets.token_hex(8)}".encode())
    with contextlib.suppress(FileNotFoundError):
        os.rename(stale, aside)
        shutil.rmtree(aside)


def _refuse(here: bytes, members: list, error: UFormError) -> None:
    seen = {str(member["host_domain_index"]): member["process"] for member in members if member is not None}
    _write(os.path.join(here, b"refused.json"), {"code": error.code.name, "message": error.message, "seen": seen})


def _join_attempt(options: MeshOptions, job: bytes, mine: dict, deadline: float) -> Roster:
    """Host domain i > 0: announce in the attempt open.json names (again whenever it changes), until a roster
    admits this process or a refusal names it."""
    index = mine["host_domain_index"]
    joined, opener = None, None
    while True:
        opened = _read(os.path.join(job, b"open.json"))
        if opened is not None and opened.get("attempt") != joined:
            attempt = str(opened.get("attempt")).encode()
            try:
                _write(os.path.join(job, attempt, f"host-{index}.json".encode()), mine)
                joined, opener = attempt.decode(), opened
            except (UFormError, OSError):
                if os.path.isdir(os.path.join(job, attempt)):
                    raise  # a directory this process cannot write, not an attempt removed meanwhile
        if joined is not None:
            here = os.path.join(job, joined.encode())
            refused = _read(os.path.join(here, b"refused.json"))
            if refused is not None and refused.get("seen", {}).get(str(index)) == mine["process"]:
                raise UFormError(ErrorCode[refused["code"]], f"{refused['message']} (refused by host domain 0)")
            roster = _read(os.path.join(here, b"roster.json"))
            members = roster.get("members", []) if roster is not None else []
            if len(members) > index and members[index].get("process") == mine["process"]:
                return Roster(joined, here, members)
        if time.monotonic() > deadline:
            raise peer_lost(_never_admitted(options, index, job, opener))
        time.sleep(POLL_SECONDS)


def _never_arrived(options: MeshOptions, missing: list[int]) -> str:
    return (f"mesh: host domains {missing} of {options.host_domain_count} never arrived in job {options.job!r} "
            f"within {options.timeout_seconds:g} s")


def _never_admitted(options: MeshOptions, index: int, job: bytes, opener: dict | None) -> str:
    """Why host domain `index` was not admitted: who is missing from the attempt it joined (`opener`, as open.json
    named it), as far as its files tell, or host domain 0 itself."""
    where = f"job {options.job!r} in {os.fsdecode(options.directory)}"
    if opener is None:
        return f"mesh: host domain 0 never opened {where} within {options.timeout_seconds:g} s"
    attempt = f"attempt {opener['attempt']} opened by {_who(opener)}"
    here = os.path.join(job, opener["attempt"].encode())
    missing = [i for i in range(options.host_domain_count)
               if not os.path.exists(os.path.join(here, f"host-{i}.json".encode()))]
    if missing:
        return f"{_never_arrived(options, missing)} ({attempt})"
    return (f"mesh: host domain {index} joined {attempt} in {where}, but host domain 0 never admitted it within "
            f"{options.timeout_seconds:g} s: an older run's attempt whose host domain 0 is gone (this run's host "
            f"domain 0 never started), or host domain 0 died, or another process claims host_domain_index {index}")
