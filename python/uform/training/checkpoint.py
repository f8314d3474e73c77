"""The Trainer's checkpoint: one safetensors file, written whole and renamed into place, its header's keys
sorted (``canonical``), so the same state always gives the same bytes.

The Trainer's ``HostState`` (``uform.nn.resident``) as tensors, each float32 in the encoder's flat order
(names from ``encoder_registry``):

    <name>                 the parameter (what a model load serves)
    optimizer.m.<name>     AdamW's first moment
    optimizer.v.<name>     AdamW's second moment

Metadata (safetensors' str → str header): ``format`` = ``uform.trainer/2``, ``step`` (optimizer
steps applied, across resumes), ``seed``, ``run``: the derived run as JSON (depth, hidden,
objective, batch, masking, contrastive, schedule), ``numerics`` = ``fast`` for a run in fast mode
(absent for identical mode, so identical runs record nothing new), ``sha256``: a JSON object giving
every tensor's SHA-256 (of its little-endian bytes), and ``metadata_sha256``: the SHA-256 of the
other fields (``metadata_digest``), so a flipped bit in the step, the seed or the run is refused too. Every
read checks the metadata and every tensor it loads against their digests, so a flipped bit is
refused with CORRUPTED naming the tensor or the metadata; ``read_tensors`` is that
verifying reader for a loader that wants the parameters alone. A resume whose geometry differs is
refused with CONFIG_MISMATCH, and so is one of another seed (the corruption draws are keyed by it);
the schedule may change across a resume. A resumed state must be one a step can continue from
(finite parameters and moments, second moments >= 0, a step count in [0, 2**31 - 1]), else
INVALID_ARGUMENT naming the tensor. The file's size is checked against the run's tensors before any
of them is allocated. ``progress(done, total)`` is called at most ``progress_steps`` times (zero:
10), the last at completion; a false answer stops the call, leaving no file (``write`` answers
False) or no trainer (a resume raises INVALID_ARGUMENT).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict
from enum import Enum

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from ..executor import NUMERIC_MODES
from ..files import float32_le_bytes, write_atomically
from ..nn.resident import MAX_STEPS, STATE_ARRAYS, HostState, named_tensors, registry_size
from ..errors import ErrorCode, UFormError

FORMAT = "uform.trainer/2"
METADATA = ("format", "step", "seed", "run", "sha256", "metadata_sha256")
"""The metadata fields every checkpoint carries."""
OPTIONAL_METADATA = ("numerics",)
"""Metadata fields a checkpoint carries when they differ from their default (numerics: "identical")."""
PREFIXES = {"parameters": "", "m": "optimizer.m.", "v": "optimizer.v."}
"""The tensor-name prefix of each array of the HostState (STATE_ARRAYS)."""


def run_json(run) -> str:
    """The derived run as canonical JSON (enums by name)."""
    def plain(value):
        if isinstance(value, Enum):
            return value.name
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return json.dumps(plain(asdict(run)), sort_keys=True, separators=(",", ":"))


class Progress:
    """Calls progress(done, total) at most `steps` times (the last at completion); answers False to stop."""

    def __init__(self, callback, steps: int, total: int):
        self.callback, self.total = callback, total
        self.every = max(1, -(-total // (steps or 10)))

    def report(self, done: int) -> bool:
        if self.callback is None or (done % self.every and done != self.total):
            return True
        return self.callback(done, self.total) is not False


def tensor_sha256(tensor: np.ndarray) -> str:
    """The SHA-256 of a tensor's little-endian bytes, as the checkpoint records it."""
    return hashlib.sha256(float32_le_bytes(tensor)).hexdigest()


def write(path, registry: list[dict], state: HostState, *, step: int, seed: int, run: str,
          numerics: str = "identical", progress=None, progress_steps: int = 0) -> bool:
    """Write the checkpoint atomically; answers True, or False (writing nothing) if progress stopped it."""
    tensors = {}
    reporter = Progress(progress, progress_steps, len(STATE_ARRAYS) * len(registry))
    for array, flat in state.arrays().items():
        for name, tensor in named_tensors(flat, registry).items():
            tensors[PREFIXES[array] + name] = tensor
            if not reporter.report(len(tensors)):
                return False
    digests = json.dumps({name: tensor_sha256(tensor) for name, tensor in tensors.items()}, sort_keys=True)
    metadata = {"format": FORMAT, "step": str(step), "seed": str(seed), "run": run, "sha256": digests}
    if numerics != "identical":
        metadata["numerics"] = numerics
    metadata["metadata_sha256"] = metadata_digest(metadata)
    write_atomically(path, canonical(save(tensors, metadata=metadata)))
    return True


def canonical(blob: bytes) -> list:
    """A safetensors file with its JSON header's keys sorted, as the chunks to write (the tensors' bytes not
    copied). safetensors writes the metadata in a hash map's order, which changes from save to save; sorted,
    the same state always gives the same bytes. The tensors' data offsets count from the end of the header,
    so they hold whatever the header's length."""
    length = int.from_bytes(blob[:8], "little")
    header = json.dumps(json.loads(blob[8:8 + length]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the data stays 8-byte aligned, as safetensors writes it
    return [len(header).to_bytes(8, "little") + header, memoryview(blob)[8 + length:]]


def metadata_digest(metadata: dict) -> str:
    """The SHA-256 of the metadata fields but its own, as sorted-key JSON of the stored strings."""
    fields = {key: metadata[key] for key in METADATA + OPTIONAL_METADATA if key != "metadata_sha256" and key in metadata}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class Checkpoint:
    """An open checkpoint file whose metadata is checked: ``metadata`` (with ``step`` and ``seed`` as
    ints, ``run`` and ``sha256`` decoded) and ``tensor(name, shape)``, verified against its digest.
    Every refusal names the file (after `label`, such as "resume")."""

    def __init__(self, file, path: str, label: str):
        self.file, self.path, self.label = file, path, label
        metadata = file.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise self.error(ErrorCode.CONFIG_MISMATCH, f"not a {FORMAT} checkpoint (format "
                                                        f"{metadata.get('format')!r})")
        missing = [field for field in METADATA if field not in metadata]
        if missing:
            raise self.error(ErrorCode.CORRUPTED, f"the metadata lacks {missing}")
        if metadata_digest(metadata) != metadata["metadata_sha256"]:
            raise self.error(ErrorCode.CORRUPTED, "the metadata (step, seed, run or digests) does not match its "
                                                  "SHA-256: the file was modified or damaged")
        try:
            self.metadata = {"step": int(metadata["step"]), "seed": int(metadata["seed"]),
                             "run": json.loads(metadata["run"]), "sha256": json.loads(metadata["sha256"]),
                             "numerics": metadata.get("numerics", "identical")}
        except ValueError as error:
            raise self.error(ErrorCode.CORRUPTED, f"unreadable metadata: {error}") from None
        if self.metadata["numerics"] not in NUMERIC_MODES:
            raise self.error(ErrorCode.CORRUPTED, f"unknown numerics {self.metadata['numerics']!r}")
        if not isinstance(self.metadata["run"], dict):
            raise self.error(ErrorCode.CORRUPTED, "the metadata's run is not a JSON object")
        if not isinstance(self.metadata["sha256"], dict) or set(self.metadata["sha256"]) != set(file.keys()):
            raise self.error(ErrorCode.CORRUPTED, "the metadata's sha256 does not list every tensor")
        if not 0 <= self.metadata["step"] <= MAX_STEPS:
            raise self.error(ErrorCode.CORRUPTED, f"step {self.metadata['step']} is outside [0, {MAX_STEPS}]")

    def error(self, code: ErrorCode, message: str) -> UFormError:
        return UFormError(code, f"{self.label}: {self.path}: {message}")

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The float32 tensor `name` (of `shape`, when given), checked against its SHA-256."""
        if name not in self.metadata["sha256"]:
            raise self.error(ErrorCode.CONFIG_MISMATCH, f"no tensor {name}")
        part = self.file.get_slice(name)
        dtype, found = part.get_dtype(), tuple(part.get_shape())
        if dtype != "F32" or (shape is not None and found != tuple(shape)):
            raise self.error(ErrorCode.CONFIG_MISMATCH, f"tensor {name} is {dtype}{list(found)}, expected "
                                                        f"F32{list(shape or found)}")
        tensor = self.file.get_tensor(name)
        if tensor_sha256(tensor) != self.metadata["sha256"][name]:
            raise self.error(ErrorCode.CORRUPTED, f"tensor {name} does not match its SHA-256: the file was "
                                                  "modified or damaged")
        return tensor


@contextlib.contextmanager
def opened(path, label: str):
    """The checkpoint at path, open and its metadata checked (``Checkpoint``)."""
    path = os.fsdecode(path)
    if not os.path.exists(path):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{label}: no checkpoint at {path}")
    if not os.path.isfile(path):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"{label}: {path} is not a file")
    try:
        file = safe_open(path, framework="numpy")
    except (SafetensorError, OSError) as error:
        raise UFormError(ErrorCode.CORRUPTED, f"{label}: {path} is not a safetensors file: {error}") from None
    with file:
        yield Checkpoint(file, path, label)


def read_tensors(path, *, optimizer: bool = False) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, tensors) of a Trainer checkpoint, every tensor verified against its SHA-256: the parameters
    by name, and with `optimizer` the AdamW moments too. The reader an inference loader uses."""
    with opened(path, "checkpoint") as checkpoint:
        names = [name for name in checkpoint.file.keys() if optimizer or not name.startswith("optimizer.")]
        return checkpoint.metadata, {name: checkpoint.tensor(name) for name in names}


def read(path, registry: list[dict], *, run: str, seed: int, progress=None, progress_steps: int = 0):
    """(HostState, step, numerics) of a checkpoint of this run's geometry and seed; None if progress stopped it."""
    with opened(path, "resume") as checkpoint:
        saved, wanted = checkpoint.metadata["run"], json.loads(run)
        differing = sorted(k for k in wanted if k != "schedule" and saved.get(k) != wanted[k])
        if checkpoint.metadata["seed"] != seed:
            differing.append("seed")
        if differing:
            raise checkpoint.error(ErrorCode.CONFIG_MISMATCH,
                                   f"saved by a run of another geometry; differing: {differing}")
        needed = len(STATE_ARRAYS) * registry_size(registry) * 4
        if os.path.getsize(checkpoint.path) < needed:
            raise checkpoint.error(ErrorCode.CORRUPTED, f"{os.path.getsize(checkpoint.path)} bytes cannot hold "
                                                        f"the run's {needed} bytes of tensors")
        arrays = {array: np.empty(registry_size(registry), np.float32) for array in STATE_ARRAYS}
        reporter = Progress(progress, progress_steps, len(STATE_ARRAYS) * len(registry))
        done = 0
        for array, flat in arrays.items():
            for name, part in named_tensors(flat, registry).items():
                part[...] = checkpoint.tensor(PREFIXES[array] + name, part.shape)
                done += 1
                if not reporter.report(done):
                    return None
        state = HostState(**arrays)
        bad = state.first_bad_value(registry)
        if bad is not None:
            raise checkpoint.error(ErrorCode.INVALID_ARGUMENT, f"{bad}: a state must hold finite parameters and "
                                                               "moments, and second moments >= 0")
        return state, checkpoint.metadata["step"], checkpoint.metadata["numerics"]
