"""Real (query, document) pairs mined from the Python standard library's own source.

Every Python install carries its standard library as source, so these pairs need no download and
no data set: ``python -m uform train`` can always fall back to them. Nothing is imported -- each
file under ``sysconfig.get_paths()["stdlib"]`` is read and parsed with :mod:`ast`.

Which files: every ``*.py`` below the stdlib root, visited in sorted order of their ``/``-joined
relative paths, except

- anything under a directory named ``test``, ``tests``, ``idlelib``, ``tkinter``, ``lib2to3``,
  ``site-packages``, ``dist-packages``, ``ensurepip``, ``turtledemo``, ``__pycache__`` or
  ``config-*``, and files named ``test_*.py``;
- private modules and packages: a path part starting with ``_`` (``__init__.py`` and
  ``__main__.py`` themselves are kept);
- a file that cannot be read as source or fails to parse.

Which definitions, in source order: public (not ``_``-prefixed) functions at module level and
public methods of public module-level classes, including those inside module-level ``if`` /
``try`` blocks, that have a docstring. For each:

- query: the docstring's first sentence -- its first paragraph (up to a blank line) with runs of
  whitespace collapsed to one space, cut after the first ``.``, ``!`` or ``?`` that is followed by
  whitespace or the end and does not end a common abbreviation (``e.g.``, ``i.e.``, ``etc.``, ...).
  Kept only if it is 20 to 300 UTF-8 bytes, and not a signature line (one starting ``name(``).
- document: the signature, ``def name(<arguments>) -> <returns>`` with the arguments and return
  annotation rebuilt by :func:`ast.unparse` (``async def`` for coroutines, no ``->`` part without
  an annotation). Methods read ``def Class.method(...)`` without their first parameter (``self``
  or ``cls``) unless decorated ``@staticmethod``.

A pair whose query, or whose document, equals one already kept is dropped (the first one in the
visiting order wins). The kept pairs are then shuffled:
``order = argsort(Philox4x64-10(key=seed + 2**64).random_raw(n), stable)`` (raw Philox output, so
the order is the same on every numpy version), and ``limit`` keeps the first ``limit`` of them.
The counts depend on the Python version (CPython 3.11.7: 3,034 pairs from 510 files).

``pydoc_data.topics`` is left out: its 79 topic titles are shorter than the 20-byte query floor.
"""

from __future__ import annotations

import ast
import os
import re
import sysconfig

import numpy as np

from ..pairs.jsonl import Pair

__all__ = ["MAX_QUERY_BYTES", "MIN_QUERY_BYTES", "mine_standard_library_pairs", "standard_library_files"]

MIN_QUERY_BYTES = 20
MAX_QUERY_BYTES = 300

_SKIPPED_DIRECTORIES = frozenset({
    "test", "tests", "idlelib", "tkinter", "lib2to3", "site-packages", "dist-packages", "ensurepip",
    "turtledemo", "__pycache__",
})
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "cf", "approx", "resp", "eg", "ie", "viz", "al", "no"})
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_WORD_BEFORE = re.compile(r"([\w.]*)$")
_CALL_PREFIX = re.compile(r"(?:\w+\.)*(\w+)\s*\(")


def _skipped_directory(name: str) -> bool:
    return name in _SKIPPED_DIRECTORIES or name.startswith("config-") or name.startswith("_")


def standard_library_files(root: str | None = None) -> list[str]:
    """The mined files' ``/``-joined paths relative to ``root`` (default: the stdlib), sorted."""
    root = root if root is not None else sysconfig.get_paths()["stdlib"]
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if not _skipped_directory(d)]
        relative = os.path.relpath(directory, root)
        prefix = "" if relative == os.curdir else relative.replace(os.sep, "/") + "/"
        for name in files:
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            if name.startswith("_") and name not in ("__init__.py", "__main__.py"):
                continue
            found.append(prefix + name)
    return sorted(found)


def first_sentence(docstring: str) -> str:
    """The first sentence of an already-cleaned docstring (see the module docstring)."""
    paragraph = []
    for line in docstring.strip().splitlines():
        if not line.strip():
            break
        paragraph.append(line.strip())
    text = " ".join(" ".join(paragraph).split())
    for match in _SENTENCE_END.finditer(text):
        if match.group() == ".":
            word = _WORD_BEFORE.search(text, 0, match.start()).group(1).lower()
            if word in _ABBREVIATIONS:
                continue
        return text[:match.end()]
    return text


def _signature(function: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None) -> str:
    arguments = function.args
    if owner is not None and not any(isinstance(d, ast.Name) and d.id == "staticmethod"
                                     for d in function.decorator_list):
        arguments = ast.arguments(posonlyargs=list(arguments.posonlyargs), args=list(arguments.args),
                                  vararg=arguments.vararg, kwonlyargs=arguments.kwonlyargs,
                                  kw_defaults=arguments.kw_defaults, kwarg=arguments.kwarg,
                                  defaults=list(arguments.defaults))
        positional = arguments.posonlyargs or arguments.args
        if positional:
            positional.pop(0)
            # defaults align with the tail of posonlyargs + args; dropping the first parameter
            # drops a default only when every positional parameter had one
            if len(arguments.defaults) > len(arguments.posonlyargs) + len(arguments.args):
                arguments.defaults.pop(0)
    name = function.name if owner is None else f"{owner}.{function.name}"
    keyword = "async def" if isinstance(function, ast.AsyncFunctionDef) else "def"
    text = f"{keyword} {name}({ast.unparse(arguments)})"
    if function.returns is not None:
        text += f" -> {ast.unparse(function.returns)}"
    return text


def _statements(body):
    """Module-level statements, looking inside ``if`` / ``try`` blocks, in source order."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try) or (hasattr(ast, "TryStar") and isinstance(node, ast.TryStar)):
            yield from _statements(node.body)
            for handler in node.handlers:
                yield from _statements(handler.body)
            yield from _statements(node.orelse)
            yield from _statements(node.finalbody)
        else:
            yield node


def _definitions(tree: ast.Module):
    """(function, owning class name or None) for every public function and method, in order."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in _statements(tree.body):
        if isinstance(node, functions) and not node.name.startswith("_"):
            yield node, None
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in _statements(node.body):
                if isinstance(member, functions) and not member.name.startswith("_"):
                    yield member, node.name


def _file_pairs(source: bytes):
    """(query, document) candidates of one file's source, in source order; [] if it fails to parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return
    for function, owner in _definitions(tree):
        docstring = ast.get_docstring(function, clean=True)
        if not docstring:
            continue
        query = first_sentence(docstring)
        if not MIN_QUERY_BYTES <= len(query.encode("utf-8", "replace")) <= MAX_QUERY_BYTES:
            continue
        call = _CALL_PREFIX.match(query)
        if call and call.group(1) == function.name:
            continue  # a signature line, not a description
        try:
            query.encode("utf-8")
            document = _signature(function, owner)
        except (UnicodeEncodeError, ValueError, RecursionError):
            continue
        yield query, document


def mine_standard_library_pairs(limit: int | None = None, seed: int = 0) -> list[Pair]:
    """Docstring-summary -> signature pairs from this Python's standard library source.

    Parameters
    ----------
    limit : int or None
        Keep the first ``limit`` pairs of the shuffled list (all of them when None).
    seed : int
        Philox key of the shuffle, in [0, 2**64).

    Deterministic for a given Python installation and seed; see the module docstring for every
    rule. Takes about a second and a half (parsing is most of it); nothing is cached.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an integer >= 0, got {limit!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    root = sysconfig.get_paths()["stdlib"]
    pairs, queries, documents = [], set(), set()
    for relative in standard_library_files(root):
        try:
            with open(os.path.join(root, *relative.split("/")), "rb") as f:
                source = f.read()
        except OSError:
            continue
        for query, document in _file_pairs(source):
            if query in queries or document in documents:
                continue
            queries.add(query)
            documents.add(document)
            pairs.append(Pair(query, document))
    order = np.argsort(np.random.Philox(key=int(seed) + 2**64).random_raw(len(pairs)), kind="stable")
    shuffled = [pairs[i] for i in order]
    return shuffled if limit is None else shuffled[:limit]
