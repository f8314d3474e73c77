"""The rendezvous: one process per host domain meets the others through files in the mesh directory.

Everything lives under ``<directory>/<job>/``; every file is written whole (``files.write_atomically``), so a
reader sees nothing or all of it:

- ``open.json``: host domain 0 opens an *attempt*, a fresh random identifier, and names it here.
- ``<attempt>/host-<i>-<process>.json``: each process's *declaration*: its host domain, the run's size, its
  executor (kind, devices, GPU class), its timeout, and a random identifier of the process itself, which the
  name carries too, so two processes that claim one host domain never overwrite each other.
- ``<attempt>/roster.json``: host domain 0, once every declaration is in and they agree, lists them all; a
  process is admitted when the roster names its own process identifier.
- ``<attempt>/refused.json``: host domain 0 refuses the attempt instead (declarations that disagree, or peers
  that never arrived), naming the processes it had seen; each of those raises the same error.

Host domain 0 removes every other entry of the job's directory when it opens an attempt (a directory renamed
aside first, so that no writer races the removal): an older attempt's files (a crashed or finished run of the
same job) are cleaned, never joined. A process that read an older
``open.json`` before host domain 0 replaced it announces itself again in the new attempt; an older roster or
refusal does not name its process identifier, so it never admits or refuses it. Host domain 0 reads every
declaration in its attempt and decides once they have stayed unchanged for SETTLE_SECONDS: two processes
claiming one host domain (a leftover of an older launch, or a mistaken index), or a host domain past the count,
refuse the attempt with CONFIG_MISMATCH naming them. Two
processes that both open the job as host domain 0 find out from open.json or from their attempt's removal:
the one that is not named raises CONFIG_MISMATCH at once. Every wait ends at the options' timeout with
PEER_LOST naming who is missing; the backend's own rendezvous (gloo's FileStore, NCCL's unique id)
goes in the attempt's directory after admission.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import dataclass

from ..files import write_atomically
from ..errors import ErrorCode, UFormError, UFormOSError
from .agreement import differences
from .collectives import peer_lost
from .options import MeshOptions, shown

PROTOCOL = 1
"""The version of these files; a process of another version is refused."""
POLL_SECONDS = 0.05
"""How often a waiting process looks at the directory."""
SETTLE_SECONDS = 0.5
"""How long the declarations must stay unchanged before host domain 0 admits or refuses them: every process
already waiting declares within a poll or two, so each is admitted, or refused with the rest (a second claimant
of a host domain, a mismatch); one that arrives later waits for its own timeout."""
COMPARED = ("protocol", "host_domain_count", "executor", "devices", "gpu_class", "timeout_seconds")
"""The declaration fields every process of a run must agree on."""
DECLARATION = re.compile(rb"host-[0-9]+-[0-9a-f]+\.json")
"""The name of a declaration file: host-<host domain>-<process>.json."""


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
    except OSError as error:
        raise UFormOSError(ErrorCode.INVALID_ARGUMENT, f"mesh: cannot read {shown(path)}: {error.strerror}") from None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise UFormError(ErrorCode.CORRUPTED, f"mesh: {shown(path)} is not a file of uform's mesh protocol")
    return value


def _declarations(here: bytes) -> list[dict]:
    """Every declaration written in attempt directory `here` (any host domain, any process), each checked to be
    one of this protocol's."""
    try:
        names = os.listdir(here)
    except FileNotFoundError:
        return []
    found = []
    for name in sorted(names):
        if DECLARATION.fullmatch(name):
            member = _read(os.path.join(here, name))
            if member is not None:
                if not isinstance(member.get("host_domain_index"), int) or not isinstance(member.get("process"), str):
                    raise UFormError(ErrorCode.CORRUPTED, f"mesh: {shown(os.path.join(here, name))} is not a "
                                                          "declaration of uform's mesh protocol")
                found.append(member)
    return found


def _declaration_name(member: dict) -> bytes:
    return f"host-{member['host_domain_index']}-{member['process']}.json".encode()


def _write(path: bytes, value: dict) -> None:
    write_atomically(path, [json.dumps(value, sort_keys=True).encode()])


def _who(entry: dict) -> str:
    return f"pid {entry.get('pid')} on {entry.get('host')!r}"


def disagreement(members: list[dict]) -> str | None:
    """What the declarations disagree on, every field named with each host domain's value; None if nothing."""
    return "; ".join(differences([(member["host_domain_index"], member) for member in members], COMPARED)) or None


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
        raise UFormOSError(ErrorCode.INVALID_ARGUMENT, f"mesh: cannot create {shown(here)}: "
                                                       f"{error.strerror}") from None
    opened = {"protocol": PROTOCOL, "attempt": attempt, "host": mine["host"], "pid": mine["pid"],
              "process": mine["process"]}
    _write(os.path.join(job, b"open.json"), opened)
    for entry in os.listdir(job):
        if entry not in (attempt.encode(), b"open.json") and not entry.startswith(b"."):
            _remove(os.path.join(job, entry))
    try:
        _write(os.path.join(here, _declaration_name(mine)), mine)
    except (UFormError, OSError):
        _check_still_opener(options, job, here, mine)  # the attempt removed by another opener names the cause
        raise
    count = options.host_domain_count
    seen, settled_since = None, time.monotonic()  # the declarations last read, and since when they are unchanged
    while True:
        _check_still_opener(options, job, here, mine)
        declared = _declarations(here)
        if [member["process"] for member in declared] != seen:
            seen, settled_since = [member["process"] for member in declared], time.monotonic()
        members = {member["host_domain_index"]: member for member in declared}
        missing = [i for i in range(count) if i not in members]
        problem = disagreement(declared) or _claims(declared, count)
        settled = time.monotonic() - settled_since >= SETTLE_SECONDS
        if problem is not None and settled:
            error = UFormError(ErrorCode.CONFIG_MISMATCH, f"mesh: the processes of job {options.job!r} declare "
                                                          f"different meshes: {problem}")
            _refuse(here, declared, error)
            raise error
        if not missing and problem is None and settled:
            break
        if time.monotonic() > deadline:
            error = peer_lost(_never_arrived(options, missing)) if missing else UFormError(
                ErrorCode.CONFIG_MISMATCH, f"mesh: the processes of job {options.job!r} declare different meshes: "
                                           f"{problem}")
            _refuse(here, declared, error)
            raise error
        time.sleep(POLL_SECONDS)
    roster = [members[i] for i in range(count)]
    _write(os.path.join(here, b"roster.json"), {"attempt": attempt, "members": roster})
    return Roster(attempt, here, roster)


def _check_still_opener(options: MeshOptions, job: bytes, here: bytes, mine: dict) -> None:
    """CONFIG_MISMATCH unless open.json still names this process and its attempt is still there: another
    process opened the job as host domain 0 after (or while) this one did."""
    now_open = _read(os.path.join(job, b"open.json"))
    if now_open is None or now_open.get("process") != mine["process"] or not os.path.isdir(here):
        raise UFormError(ErrorCode.CONFIG_MISMATCH, f"mesh: job {options.job!r} was opened again as host domain 0 "
                         f"by {_who(now_open or {})} while this process ({_who(mine)}) held it: two processes claim "
                         "host_domain_index 0, or another launch of the job started")


def _claims(declared: list[dict], count: int) -> str | None:
    """Host domains claimed by two processes, or past the count, named with each claimant; None if none."""
    by_index: dict[int, list[dict]] = {}
    for member in declared:
        by_index.setdefault(member["host_domain_index"], []).append(member)
    problems = [f"host domain {i} is claimed by " + " and ".join(_who(member) for member in claimants)
                for i, claimants in sorted(by_index.items()) if len(claimants) > 1]
    problems += [f"host domain {i} ({_who(claimants[0])}) is past host_domain_count {count}"
                 for i, claimants in sorted(by_index.items()) if i >= count]
    return "; ".join(problems) or None


def _remove(stale: bytes) -> None:
    """Remove an older attempt's entry, best effort (what stays is removed the next time). A directory is first
    renamed aside, atomically, so that a process still writing its declaration into it (it read the older
    open.json) fails to, rather than racing the removal; a link or a file is unlinked."""
    try:
        if os.path.islink(stale) or not os.path.isdir(stale):
            os.unlink(stale)
            return
        aside = os.path.join(os.path.dirname(stale), f"removed-{secrets.token_hex(8)}".encode())
        os.rename(stale, aside)
    except FileNotFoundError:
        return
    except OSError as error:
        raise UFormOSError(ErrorCode.INVALID_ARGUMENT, f"mesh: cannot remove {shown(stale)}, left by an older "
                                                       f"attempt: {error.strerror}") from None
    shutil.rmtree(aside, ignore_errors=True)


def _refuse(here: bytes, members: list[dict], error: UFormError) -> None:
    """refused.json: the error, and every process it refuses (seen: process identifiers)."""
    seen = sorted(member["process"] for member in members)
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
                _write(os.path.join(job, attempt, _declaration_name(mine)), mine)
                joined, opener = attempt.decode(), opened
            except (UFormError, OSError):
                if os.path.isdir(os.path.join(job, attempt)):
                    raise  # a directory this process cannot write, not an attempt removed meanwhile
        if joined is not None:
            here = os.path.join(job, joined.encode())
            refused = _read(os.path.join(here, b"refused.json"))
            if refused is not None and mine["process"] in refused.get("seen", []):
                code = ErrorCode.__members__.get(str(refused.get("code")), ErrorCode.CONFIG_MISMATCH)
                raise UFormError(code, f"{refused.get('message')} (refused by host domain 0)")
            roster = _read(os.path.join(here, b"roster.json"))
            members = roster.get("members", []) if roster is not None else []
            if len(members) > index and isinstance(members[index], dict) and \
                    members[index].get("process") == mine["process"]:
                if len(members) != options.host_domain_count:
                    raise UFormError(ErrorCode.CONFIG_MISMATCH, f"mesh: host domain 0 admitted {len(members)} host "
                                     f"domains; this process declared {options.host_domain_count}")
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
    where = f"job {options.job!r} in {shown(options.directory)}"
    if opener is None:
        return f"mesh: host domain 0 never opened {where} within {options.timeout_seconds:g} s"
    attempt = f"attempt {opener.get('attempt')} opened by {_who(opener)}"
    here = os.path.join(job, str(opener.get("attempt")).encode())
    if not os.path.isdir(here):
        return (f"mesh: host domain {index} joined {attempt} in {where}, whose directory was removed: another "
                "process opened the job as host domain 0 since")
    declared = {member["host_domain_index"] for member in _declarations(here)}
    missing = [i for i in range(options.host_domain_count) if i not in declared]
    if missing:
        return f"{_never_arrived(options, missing)} ({attempt})"
    return (f"mesh: host domain {index} joined {attempt} in {where}, but host domain 0 never admitted it within "
            f"{options.timeout_seconds:g} s: an older run's attempt whose host domain 0 is gone (this run's host "
            f"domain 0 never started), or host domain 0 died, or another process claims host_domain_index {index}")
