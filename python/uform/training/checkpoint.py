"""The Trainer's checkpoint: one safetensors file, written whole and renamed into place.

The Trainer's ``HostState`` (``uform.nn.resident``) as tensors, each float32 in the encoder's flat order
(names from ``encoder_registry``):

    <name>                 the parameter (what a model load serves)
    optimizer.m.<name>     AdamW's first moment
    optimizer.v.<name>     AdamW's second moment

Metadata (safetensors' str → str header): ``format`` = ``uform.trainer/1``, ``step`` (optimizer
steps applied, across resumes), ``seed``, and ``run``: the derived run as JSON (depth, hidden,
objective, batch, masking, contrastive, schedule). A resume whose geometry differs is refused with
CONFIG_MISMATCH, and so is one of another seed (the corruption draws are keyed by it). The
schedule may change across a resume. ``progress(done, total)`` is called at most ``progress_steps`` times (zero: 10),
the last at completion; a false answer stops the call, leaving no file (save) or no trainer (load).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from enum import Enum

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save

from ..files import write_atomically
from ..nn.resident import STATE_ARRAYS, HostState, named_tensors, registry_size
from .errors import ErrorCode, UFormError

FORMAT = "uform.trainer/1"
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


def write(path, registry: list[dict], state: HostState, *, step: int, seed: int, run: str, progress=None,
          progress_steps: int = 0) -> bool:
    """Write the checkpoint atomically; answers False (and writes nothing) if progress stopped it."""
    tensors = {}
    reporter = Progress(progress, progress_steps, len(STATE_ARRAYS) * len(registry))
    for array, flat in state.arrays().items():
        for name, tensor in named_tensors(flat, registry).items():
            tensors[PREFIXES[array] + name] = tensor
            if not reporter.report(len(tensors)):
                return False
    write_atomically(path, [save(tensors, metadata={"format": FORMAT, "step": str(step), "seed": str(seed),
                                                    "run": run})])
    return True


def read(path, registry: list[dict], *, run: str, seed: int, progress=None, progress_steps: int = 0):
    """(HostState, step) of a checkpoint of this run's geometry and seed; None if progress stopped it."""
    path = os.fsdecode(path)
    if not os.path.exists(path):
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"resume: no checkpoint at {path}")
    with safe_open(path, framework="numpy") as file:
        metadata = file.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise UFormError(ErrorCode.CONFIG_MISMATCH, f"resume: {path} is not a {FORMAT} checkpoint")
        saved, wanted = json.loads(metadata["run"]), json.loads(run)
        differing = sorted(k for k in wanted if k != "schedule" and saved.get(k) != wanted[k])
        if int(metadata.get("seed", -1)) != seed:
            differing.append("seed")
        if differing:
            raise UFormError(ErrorCode.CONFIG_MISMATCH,
                             f"resume: {path} was saved by a run of another geometry; differing: {differing}")
        arrays = {array: np.empty(registry_size(registry), np.float32) for array in STATE_ARRAYS}
        reporter = Progress(progress, progress_steps, len(STATE_ARRAYS) * len(registry))
        done = 0
        for array, flat in arrays.items():
            for name, part in named_tensors(flat, registry).items():
                tensor = file.get_tensor(PREFIXES[array] + name)
                if tensor.dtype != np.float32 or tensor.shape != part.shape:
                    raise UFormError(ErrorCode.CONFIG_MISMATCH, f"resume: tensor {PREFIXES[array] + name} is "
                                     f"{tensor.dtype}{tensor.shape}, expected float32{part.shape}")
                part[...] = tensor
                done += 1
                if not reporter.report(done):
                    return None
    return HostState(**arrays), int(metadata["step"])
