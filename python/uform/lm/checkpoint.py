"""Training-state validation and the two checkpoint formats (no pickle).

A training state is a dict::

    {"format": "uform.lm/1",
     "config": {LanguageModelConfig fields},
     "hyperparameters": {"lr", "betas": (b1, b2), "eps", "weight_decay"},
     "step": completed steps (int >= 0),
     "parameters", "m", "v": float32 arrays of config n_total values,  # uform.nn.resident.HostState
     "data_schedule": dict, "metadata": dict}       # small, JSON round-trippable

JSON checkpoint (at most 2 MiB): one canonical JSON object (sorted keys, no
whitespace) holding the state with each array as
``{"dtype": "<f4", "count": n, "base64": base64 of the little-endian bytes}``
and a top-level ``"sha256"``: the SHA-256 of the canonical JSON of every other
field, so weights, moments and data_schedule are all covered.

Binary checkpoint (any size)::

    b"UFORMLM1" | header length (u64, little-endian) | header (canonical JSON) | arrays

The header holds the state's non-array fields, ``"arrays"``: one
``{"name", "dtype": "<f4", "count", "offset", "sha256"}`` per array, with
``offset`` counted from the end of the header, and a ``"sha256"`` over the
canonical JSON of the rest of the header. The arrays follow as raw
little-endian float32, so a round trip is bit-exact.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os

import numpy as np

from ..executor import NUMERIC_MODES
from ..files import float32_le_bytes, write_atomically
from ..nn.resident import MAX_LEARNING_RATE, MAX_STEPS, MIN_EPS, STATE_ARRAYS, HostState
from ..errors import ErrorCode, UFormError, UFormOSError, type_error, value_error
from .config import LanguageModelConfig, parameter_registry

FORMAT = "uform.lm/1"
ARRAYS = STATE_ARRAYS
STATE_KEYS = frozenset({"format", "config", "hyperparameters", "step", "data_schedule", "metadata", *ARRAYS})
HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")
JSON_LIMIT_BYTES = 2 * 1024 * 1024
DESCRIPTOR_LIMIT_BYTES = 64 * 1024
HEADER_LIMIT_BYTES = 1024 * 1024
BINARY_MAGIC = b"UFORMLM1"
FLOAT32_MAX = float(np.finfo(np.float32).max)
_DTYPE = "<f4"


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def _corrupt(message: str):
    return value_error(message, ErrorCode.CORRUPTED)


@contextlib.contextmanager
def _reading(path):
    """Open a checkpoint file for reading; a refusal, or a file that cannot be read, names the file."""
    name = os.fsdecode(path)
    try:
        with open(path, "rb") as file:
            yield file
    except UFormError as error:
        raise type(error)(error.code, f"{name}: {error.message}") from None
    except OSError as error:
        raise UFormOSError(ErrorCode.INVALID_ARGUMENT, f"{name}: cannot read the checkpoint: "
                                                       f"{error.strerror or error}") from None


def _digest(fields: dict) -> str:
    return hashlib.sha256(_canonical(fields)).hexdigest()


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _real(value, label: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise value_error(f"{label} must be a real number, got {value!r}")
    value = float(value)
    if not abs(value) <= FLOAT32_MAX:
        raise value_error(f"{label} must be finite in float32, got {value}")
    return value


def _descriptor(value, label: str) -> dict:
    """A fresh copy of a small dict that survives a JSON round trip unchanged."""
    if not isinstance(value, dict):
        raise value_error(f"{label} must be a dict, got {type(value).__name__}")
    try:
        encoded = _canonical(value)
    except (TypeError, ValueError) as error:
        raise value_error(f"{label} is not JSON-serialisable: {error}") from None
    if len(encoded) > DESCRIPTOR_LIMIT_BYTES:
        raise value_error(f"{label} is {len(encoded)} bytes as JSON, over the {DESCRIPTOR_LIMIT_BYTES}-byte limit")
    copy = json.loads(encoded)
    if copy != value:
        raise value_error(f"{label} changes in a JSON round trip (tuples, non-string keys?); use lists and str keys")
    return copy


def _hyperparameters(value) -> dict:
    if not isinstance(value, dict) or set(value) != set(HYPERPARAMETERS):
        raise value_error(f"hyperparameters must be a dict with exactly the keys {list(HYPERPARAMETERS)}")
    lr, eps, decay = (_real(value[k], f"hyperparameters.{k}") for k in ("lr", "eps", "weight_decay"))
    betas = value["betas"]
    if not isinstance(betas, (list, tuple)) or len(betas) != 2:
        raise value_error(f"hyperparameters.betas must be a pair of numbers, got {betas!r}")
    betas = tuple(_real(b, "hyperparameters.betas") for b in betas)
    if lr < 0 or eps < 0 or decay < 0:
        raise value_error(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {decay}")
    if lr > MAX_LEARNING_RATE:
        raise value_error(f"hyperparameters.lr must be at most {MAX_LEARNING_RATE}, got {lr}")
    if eps < MIN_EPS:
        raise value_error(f"hyperparameters.eps must be at least {MIN_EPS:.3g} (a zero gradient with ε = 0 "
                          f"updates to 0/0 = NaN), got {eps}")
    if lr * decay > 1:
        raise value_error(f"hyperparameters.weight_decay: lr·weight_decay = {lr * decay} exceeds 1 (the decay "
                          f"factor 1 − lr·weight_decay would flip every weight's sign)")
    if not all(0.0 <= b < 1.0 for b in betas):
        raise value_error(f"hyperparameters.betas must lie in [0, 1), got {betas}")
    return {"lr": lr, "betas": betas, "eps": eps, "weight_decay": decay}


def _config(value, shape: LanguageModelConfig | None) -> LanguageModelConfig:
    try:
        config = LanguageModelConfig.from_dict(value)
    except (TypeError, ValueError) as error:
        raise value_error(f"invalid config: {error}") from None
    if shape is not None and config != shape:
        raise value_error(f"state config {config} does not match the model shape {shape}",
                          ErrorCode.CONFIG_MISMATCH)
    return config


def _checked(state, shape: LanguageModelConfig | None, copy: bool) -> dict:
    if not isinstance(state, dict):
        raise value_error(f"a training state must be a dict, got {type(state).__name__}")
    missing, extra = STATE_KEYS - state.keys(), state.keys() - STATE_KEYS
    if missing or extra:
        raise value_error(f"training state keys do not match {FORMAT}: missing {sorted(missing)}, "
                          f"unknown {sorted(map(str, extra))}")
    if state["format"] != FORMAT:
        raise value_error(f"unsupported state format {state['format']!r}; expected {FORMAT!r}")
    config = _config(state["config"], shape)
    step = state["step"]
    if not _is_int(step) or not 0 <= step <= MAX_STEPS:
        raise value_error(f"step must be an integer in [0, {MAX_STEPS}], got {step!r}")
    checked = {
        "format": FORMAT,
        "config": config.to_dict(),
        "hyperparameters": _hyperparameters(state["hyperparameters"]),
        "step": int(step),
        "data_schedule": _descriptor(state["data_schedule"], "data_schedule"),
        "metadata": _descriptor(state["metadata"], "metadata"),
    }
    numerics = checked["metadata"].get("numerics", "identical")
    if numerics not in NUMERIC_MODES:
        raise value_error(f"metadata.numerics: {numerics!r} is not a numeric mode; one of {list(NUMERIC_MODES)}")
    n_vocab = checked["data_schedule"].get("n_vocab")
    if n_vocab is not None and n_vocab != config.vocab_size:
        raise value_error(f"data_schedule n_vocab {n_vocab!r} differs from the config vocab_size {config.vocab_size}")
    for name in ARRAYS:
        array = state[name]
        if not isinstance(array, np.ndarray) or array.dtype != np.float32 or not array.dtype.isnative:
            raise value_error(f"{name} must be a float32 numpy array, got "
                              f"{getattr(array, 'dtype', type(array).__name__)}")
        if array.shape != (config.n_total,):
            raise value_error(f"{name} must have shape ({config.n_total},) for this config, got {array.shape}")
        checked[name] = np.array(array, order="C") if copy else np.ascontiguousarray(array)
    bad = HostState(*(checked[name] for name in ARRAYS)).first_bad_value(parameter_registry(config))
    if bad is not None:
        raise value_error(f"{bad}: a state must hold finite parameters and moments, and second moments >= 0")
    return checked


def validate_state(state, shape: LanguageModelConfig | None = None) -> dict:
    """Check a training state completely and return a normalised deep copy.

    Checks the keys and format, the config fields (and, when ``shape`` is
    given, that they equal it), hyperparameters finite in float32 with betas
    in [0, 1), lr in [0, 1], eps at least float32's smallest normal and
    lr·weight_decay at most 1, ``0 <= step <= 2**31 - 1``, that parameters,
    m and v are float32 arrays of n_total finite values (v >= 0), and that
    data_schedule and metadata are small JSON round-trippable dicts (with
    data_schedule's n_vocab, if any, equal to vocab_size). Raises a
    UFormError that is a ValueError on the first problem; since the result is a copy, a caller that
    loads only what this returns is unchanged by a refused state.
    """
    return _checked(state, shape, copy=True)


def _header_fields(state: dict) -> dict:
    fields = {k: state[k] for k in ("format", "config", "step", "data_schedule", "metadata")}
    fields["hyperparameters"] = dict(state["hyperparameters"], betas=list(state["hyperparameters"]["betas"]))
    return fields


# ---------------------------------------------------------------- JSON format

def _verified_json(encoded: bytes, what: str, invalid: str) -> dict:
    """Decode a JSON object carrying its own "sha256" over the rest, check the digest, drop it."""
    try:
        document = json.loads(encoded.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _corrupt(f"{invalid}: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("sha256"), str):
        raise _corrupt(f"{what}: no top-level sha256")
    recorded = document.pop("sha256")
    if recorded != _digest(document):
        raise _corrupt(f"{what} digest mismatch: the file was modified")
    return document


def encode_json_checkpoint(state) -> bytes:
    """The JSON checkpoint of a state, as bytes; ValueError if over 2 MiB."""
    state = _checked(state, None, copy=False)
    document = _header_fields(state)
    for name in ARRAYS:
        document[name] = {"dtype": _DTYPE, "count": int(state[name].size),
                          "base64": base64.b64encode(float32_le_bytes(state[name])).decode("ascii")}
    document["sha256"] = _digest(document)
    encoded = _canonical(document)
    if len(encoded) > JSON_LIMIT_BYTES:
        raise value_error(f"the JSON checkpoint would be {len(encoded)} bytes, over the 2 MiB limit "
                          f"(n_total = {state['parameters'].size}); use write_binary_checkpoint() instead")
    return encoded


def write_json_checkpoint(path, state) -> None:
    """Write the JSON checkpoint of a state to path atomically."""
    write_atomically(path, [encode_json_checkpoint(state)])


def read_json_checkpoint_bytes(encoded: bytes) -> dict:
    """Decode and verify a JSON checkpoint; returns the validated state.

    Raises ValueError for anything but an intact checkpoint: oversized or
    truncated input, a digest mismatch (the file was modified), a malformed
    array or an invalid state.
    """
    if type(encoded) is not bytes:
        raise type_error(f"encoded must be bytes (copy mutable buffers first), got {type(encoded).__name__}")
    if len(encoded) > JSON_LIMIT_BYTES:
        raise value_error(f"input is {len(encoded)} bytes, over the 2 MiB JSON checkpoint limit")
    document = _verified_json(encoded, "checkpoint", "not a valid JSON checkpoint (truncated or corrupted?)")
    if set(document) != STATE_KEYS:
        raise _corrupt(f"checkpoint fields {sorted(document)} do not match {FORMAT}")
    for name in ARRAYS:
        entry = document[name]
        if not isinstance(entry, dict) or set(entry) != {"dtype", "count", "base64"} or entry["dtype"] != _DTYPE \
                or not _is_int(entry["count"]) or not isinstance(entry["base64"], str):
            raise _corrupt(f"checkpoint array {name!r} must be {{'dtype': '<f4', 'count': int, 'base64': str}}")
        try:
            raw = base64.b64decode(entry["base64"], validate=True)
        except binascii.Error as error:
            raise _corrupt(f"checkpoint array {name!r} is not valid base64: {error}") from None
        if len(raw) != 4 * entry["count"]:
            raise _corrupt(f"checkpoint array {name!r} holds {len(raw)} bytes, "
                           f"expected {4 * entry['count']}: truncated")
        document[name] = np.frombuffer(raw, dtype=_DTYPE).astype(np.float32)
    return _checked(document, None, copy=False)


def read_json_checkpoint(path) -> dict:
    """Read, verify and validate a JSON checkpoint file."""
    with _reading(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > JSON_LIMIT_BYTES:
            raise _corrupt(f"{size} bytes, over the 2 MiB JSON checkpoint limit")
        return read_json_checkpoint_bytes(f.read())


# -------------------------------------------------------------- binary format

def write_binary_checkpoint(path, state) -> str:
    """Write the binary checkpoint of a state to path atomically; returns the file's SHA-256."""
    state = _checked(state, None, copy=False)
    header = _header_fields(state)
    header["arrays"], offset = [], 0
    for name in ARRAYS:
        data = float32_le_bytes(state[name])
        header["arrays"].append({"name": name, "dtype": _DTYPE, "count": int(state[name].size),
                                 "offset": offset, "sha256": hashlib.sha256(data).hexdigest()})
        offset += data.nbytes
    header["sha256"] = _digest(header)
    encoded = _canonical(header)
    chunks = [BINARY_MAGIC + len(encoded).to_bytes(8, "little"), encoded,
              *(float32_le_bytes(state[name]) for name in ARRAYS)]
    file_digest = hashlib.sha256()
    for chunk in chunks:
        file_digest.update(chunk)
    write_atomically(path, chunks)
    return file_digest.hexdigest()


def _binary_header(encoded: bytes) -> tuple[dict, LanguageModelConfig]:
    header = _verified_json(encoded, "checkpoint header", "binary checkpoint header is not valid JSON (corrupted?)")
    expected = (STATE_KEYS - set(ARRAYS)) | {"arrays"}
    if set(header) != expected:
        raise _corrupt(f"binary checkpoint header fields {sorted(header)} do not match {FORMAT}")
    config = _config(header["config"], None)
    arrays, offset = header["arrays"], 0
    if not isinstance(arrays, list) or [a.get("name") if isinstance(a, dict) else None for a in arrays] != list(ARRAYS):
        raise _corrupt(f"binary checkpoint must list the arrays {list(ARRAYS)} in order")
    for entry in arrays:
        if set(entry) != {"name", "dtype", "count", "offset", "sha256"} or entry["dtype"] != _DTYPE \
                or entry["count"] != config.n_total or entry["offset"] != offset \
                or not isinstance(entry["sha256"], str):
            raise _corrupt(f"binary checkpoint array entry {entry!r} does not match the config "
                           f"({config.n_total} '<f4' values at offset {offset})")
        offset += 4 * config.n_total
    return header, config


def read_binary_checkpoint(path) -> dict:
    """Read, verify and validate a binary checkpoint file; returns the state.

    Verifies the magic bytes, the header digest and structure, and that the
    file is exactly as long as the header implies, before allocating any
    array; then each array's SHA-256. Raises ValueError on any mismatch.
    """
    with _reading(path) as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(16)
        if len(prefix) < 16 or prefix[:8] != BINARY_MAGIC:
            raise _corrupt("not a uform.lm binary checkpoint (bad magic bytes or truncated)")
        header_length = int.from_bytes(prefix[8:], "little")
        if header_length > min(size - 16, HEADER_LIMIT_BYTES):
            raise _corrupt(f"binary checkpoint header length {header_length} exceeds the file "
                           f"({size} bytes) or the {HEADER_LIMIT_BYTES}-byte limit: truncated or corrupted")
        header, config = _binary_header(f.read(header_length))
        implied = 16 + header_length + 4 * config.n_total * len(ARRAYS)
        if size != implied:
            raise _corrupt(f"binary checkpoint is {size} bytes but its header implies {implied}: "
                           f"{'truncated' if size < implied else 'trailing data'}")
        state = {k: header[k] for k in header if k != "arrays"}
        for entry in header["arrays"]:
            array = np.empty(entry["count"], dtype=_DTYPE)
            if f.readinto(memoryview(array).cast("B")) != array.nbytes:
                raise _corrupt(f"binary checkpoint array {entry['name']!r} is truncated")
            if hashlib.sha256(array).hexdigest() != entry["sha256"]:
                raise _corrupt(f"checkpoint array {entry['name']!r} digest mismatch: the file was modified")
            state[entry["name"]] = array.astype(np.float32, copy=False)
        return _checked(state, None, copy=False)
