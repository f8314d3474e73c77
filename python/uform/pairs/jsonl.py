"""The JSONL pair format: the training data of ``python -m uform train``.

A pair file is UTF-8 text, one JSON object per line, each a (query, document) pair the
contrastive objective pulls together::

    {"query": "Return the base name of pathname p.", "document": "def basename(p)"}
    {"query": "How do I reverse a list?", "document": "list.reverse()", "weight": 2.0, "group": 1}

Keys (any other key is refused, so a typo like ``"doc"`` cannot pass silently):

``query`` : str, required
    The anchor text. Not empty, not only whitespace, and encodable as UTF-8 (JSON's
    ``\\ud800``-style escapes can spell a lone surrogate, which has no bytes).
``document`` : str, required
    The text that answers the query; same rules as ``query``.
``weight`` : number, optional, default 1.0
    The pair's weight in the loss: finite and > 0 (an integer like ``2`` is read as 2.0).
``group`` : int, optional, default 0
    A caller-defined label, >= 0 (the run may use it as the temperature group). Booleans are
    not integers here, nor is ``1.0``.

sentence-transformers' column names are read too: ``anchor`` for ``query`` and ``positive`` for
``document`` (a line names its texts one way or the other, not both). A ``negative`` column (hard
negatives) is refused, saying so: the format has no place for it yet.

Blank (empty or whitespace-only) lines are skipped; line numbers in errors count every physical
line from 1, blank ones included, so they match an editor's. Every error is a
:class:`PairFormatError` (a ``UFormError`` with ``ErrorCode.INVALID_ARGUMENT``, and also a
``ValueError``) whose message reads ``"<path>:<line>: <problem>"``, e.g.
``"pairs.jsonl:7: missing key 'document'"``.

:func:`write_pairs` writes the canonical form: keys in the order above, ``weight`` left out when it
is 1.0 and ``group`` when it is 0, no ASCII escaping, ``"\\n"`` after every line, so
``read_pairs(write_pairs(p, pairs)) == pairs``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ErrorCode, UFormError
from ..files import bounded_lines

__all__ = ["Pair", "PairFormatError", "read_pairs", "write_pairs"]

_KEYS = ("query", "document", "weight", "group")
MAX_LINE_BYTES = 1 << 24  # a line's bytes at most: a pair of texts, never a whole file without newlines
_ALIASES = {"query": "anchor", "document": "positive"}  # sentence-transformers' names of the two texts


class PairFormatError(UFormError, ValueError):
    """A malformed pair or pair file; the message names the line (or pair index) and the problem."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.INVALID_ARGUMENT, message)


def _check_text(key: str, value) -> str | None:
    if not isinstance(value, str):
        return f"{key!r} must be a string, got {type(value).__name__}"
    if not value.strip():
        return f"{key!r} is empty" if not value else f"{key!r} is only whitespace"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"{key!r} is not encodable as UTF-8 ({error.reason} at character {error.start})"
    return None


def _problem(query, document, weight, group) -> str | None:
    """The first thing wrong with these field values, or None."""
    for key, value in (("query", query), ("document", document)):
        problem = _check_text(key, value)
        if problem:
            return problem
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        return f"'weight' must be a number, got {type(weight).__name__}"
    if not math.isfinite(weight) or weight <= 0:
        return f"'weight' must be finite and > 0, got {weight!r}"
    if isinstance(group, bool) or not isinstance(group, int):
        return f"'group' must be an integer, got {type(group).__name__}"
    if group < 0:
        return f"'group' must be >= 0, got {group}"
    return None


@dataclass(frozen=True)
class Pair:
    """One training pair: ``query`` should embed near ``document``.

    Validated on construction (the rules of the module docstring); ``weight`` is stored as a float.
    """

    query: str
    document: str
    weight: float = 1.0
    group: int = 0

    def __post_init__(self):
        problem = _problem(self.query, self.document, self.weight, self.group)
        if problem:
            raise PairFormatError(problem)
        object.__setattr__(self, "weight", float(self.weight))

    def to_json(self) -> str:
        """The canonical one-line JSON form (no trailing newline)."""
        record = {"query": self.query, "document": self.document}
        if self.weight != 1.0:
            record["weight"] = self.weight
        if self.group != 0:
            record["group"] = self.group
        return json.dumps(record, ensure_ascii=False)


def _parse_line(text: str) -> Pair:
    """One non-blank line to a Pair, or a PairFormatError naming the problem (the caller adds the line)."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise PairFormatError(f"bad JSON: {error.msg} at column {error.colno}") from None
    except RecursionError:
        raise PairFormatError("bad JSON: nested too deeply for a pair") from None
    if not isinstance(record, dict):
        raise PairFormatError(f"expected a JSON object, got {type(record).__name__}")
    for ours, theirs in _ALIASES.items():
        if theirs in record:
            if ours in record:
                raise PairFormatError(f"both {ours!r} and {theirs!r} (sentence-transformers' name for it): keep one")
            record[ours] = record.pop(theirs)
    if "negative" in record or any(key.startswith("negative_") for key in record):
        raise PairFormatError("a 'negative' column (hard negatives) is not read: the pair format has no place for it "
                              "yet; leave it out")
    for key in ("query", "document"):
        if key not in record:
            raise PairFormatError(f"missing key {key!r}")
    unknown = sorted(set(record) - set(_KEYS))
    if unknown:
        raise PairFormatError(f"unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
    return Pair(record["query"], record["document"], record.get("weight", 1.0), record.get("group", 0))


def read_pairs(path: str | os.PathLike) -> list[Pair]:
    """Every pair of a JSONL pair file, in file order (see the module docstring for the format); a line may hold
    at most MAX_LINE_BYTES."""
    name = os.fspath(path)
    pairs = []
    with open(path, "rb") as file:
        for number, raw in enumerate(bounded_lines(file, MAX_LINE_BYTES, PairFormatError), start=1):
            try:
                if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # a UTF-8 byte-order mark
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise PairFormatError(f"invalid UTF-8 at byte {error.start} of the line") from None
                if not text.strip():
                    continue
                pairs.append(_parse_line(text))
            except PairFormatError as error:
                raise PairFormatError(f"{name}:{number}: {error.message}") from None
    return pairs


def write_pairs(path: str | os.PathLike, pairs: Iterable[Pair]) -> int:
    """Write ``pairs`` to ``path`` in the canonical JSONL form; returns how many were written.

    Each item must be a :class:`Pair`; anything else is refused (naming its index) before the file
    is touched.
    """
    pairs = list(pairs)
    for index, pair in enumerate(pairs):
        if not isinstance(pair, Pair):
            raise PairFormatError(f"pairs[{index}]: expected a Pair, got {type(pair).__name__}")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for pair in pairs:
            f.write(pair.to_json())
            f.write("\n")
    return len(pairs)
