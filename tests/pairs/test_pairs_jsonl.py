"""The JSONL pair format: round trip and one test per refusal, each naming the line."""

import json

import pytest

from uform.pairs import Pair, PairFormatError, read_pairs, write_pairs
from uform.errors import ErrorCode, UFormError


def _file(tmp_path, text, name="pairs.jsonl"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def test_round_trip(tmp_path):
    pairs = [
        Pair("Return the base name of pathname p.", "def basename(p)"),
        Pair("naïve — 日本語 \"quoted\"\nnewline", "doc\twith tab", weight=2.5, group=3),
        Pair("q", "d", weight=1, group=0),
    ]
    path = tmp_path / "out.jsonl"
    assert write_pairs(path, pairs) == 3
    assert read_pairs(path) == pairs
    assert read_pairs(str(path)) == pairs
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 4
    assert json.loads(lines[0]) == {"query": "Return the base name of pathname p.", "document": "def basename(p)"}
    assert json.loads(lines[1])["weight"] == 2.5 and json.loads(lines[1])["group"] == 3
    assert "日本語" in lines[1]  # no ASCII escaping
    assert isinstance(read_pairs(path)[2].weight, float)


def test_blank_lines_crlf_and_bom_are_accepted(tmp_path):
    path = _file(tmp_path, b'\xef\xbb\xbf{"query": "a", "document": "b"}\r\n\r\n   \n{"query": "c", "document": "d", "weight": 3}')
    assert read_pairs(path) == [Pair("a", "b"), Pair("c", "d", 3.0)]
    assert read_pairs(_file(tmp_path, "", "empty.jsonl")) == []


def test_sentence_transformers_column_names_are_read(tmp_path):
    path = _file(tmp_path, '{"anchor": "a", "positive": "b"}\n{"anchor": "c", "document": "d", "weight": 2}\n')
    assert read_pairs(path) == [Pair("a", "b"), Pair("c", "d", 2.0)]


def _refusal(tmp_path, text):
    path = _file(tmp_path, '{"query": "fine", "document": "fine"}\n\n' + text + "\n")
    with pytest.raises(PairFormatError) as info:
        read_pairs(path)
    error = info.value
    assert isinstance(error, UFormError) and isinstance(error, ValueError)
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert str(error).startswith(f"{path}:3: "), str(error)  # the blank line 2 still counts
    return str(error).split(":3: ", 1)[1]


@pytest.mark.parametrize("line, message", [
    ('{"query": "a", "document": ', "bad JSON: Expecting value at column 28"),
    ('{"query": "a" "document": "b"}', "bad JSON: Expecting ',' delimiter at column 15"),
    ('["a", "b"]', "expected a JSON object, got list"),
    ('"text"', "expected a JSON object, got str"),
    ('{"document": "b"}', "missing key 'query'"),
    ('{"query": "a"}', "missing key 'document'"),
    ('{"query": "a", "document": "b", "doc": "c"}', "unknown key 'doc' (allowed: query, document, weight, group)"),
    ('{"query": 1, "document": "b"}', "'query' must be a string, got int"),
    ('{"query": "a", "document": null}', "'document' must be a string, got NoneType"),
    ('{"query": "", "document": "b"}', "'query' is empty"),
    ('{"query": "a", "document": " \\n\\t"}', "'document' is only whitespace"),
    ('{"query": "\\ud800x", "document": "b"}', "'query' is not encodable as UTF-8 (surrogates not allowed at character 0)"),
    ('{"query": "a", "document": "b", "weight": "2"}', "'weight' must be a number, got str"),
    ('{"query": "a", "document": "b", "weight": true}', "'weight' must be a number, got bool"),
    ('{"query": "a", "document": "b", "weight": 0}', "'weight' must be finite and > 0, got 0"),
    ('{"query": "a", "document": "b", "weight": -1.5}', "'weight' must be finite and > 0, got -1.5"),
    ('{"query": "a", "document": "b", "weight": NaN}', "'weight' must be finite and > 0, got nan"),
    ('{"query": "a", "document": "b", "group": 1.0}', "'group' must be an integer, got float"),
    ('{"query": "a", "document": "b", "group": false}', "'group' must be an integer, got bool"),
    ('{"query": "a", "document": "b", "group": -1}', "'group' must be >= 0, got -1"),
    ('[' * 100000 + ']' * 100000, "bad JSON: nested too deeply for a pair"),
    ('{"query": "a", "anchor": "a", "document": "b"}',
     "both 'query' and 'anchor' (sentence-transformers' name for it): keep one"),
    ('{"anchor": "a", "positive": "b", "negative": "c"}', "a 'negative' column (hard negatives) is not read: the pair "
                                                          "format has no place for it yet; leave it out"),
])
def test_refusals_name_the_line_and_problem(tmp_path, line, message):
    assert _refusal(tmp_path, line) == message


def test_invalid_utf8_names_the_line(tmp_path):
    path = _file(tmp_path, b'{"query": "a", "document": "b"}\n{"query": "\xff", "document": "b"}\n')
    with pytest.raises(PairFormatError, match=r":2: invalid UTF-8 at byte 11 of the line$"):
        read_pairs(path)


def test_pair_validates_itself_and_is_frozen():
    with pytest.raises(PairFormatError, match="'document' is empty"):
        Pair("query", "")
    pair = Pair("q", "d")
    with pytest.raises(AttributeError):
        pair.query = "other"


def test_write_refuses_non_pairs_before_touching_the_file(tmp_path):
    path = tmp_path / "out.jsonl"
    with pytest.raises(PairFormatError, match=r"pairs\[1\]: expected a Pair, got dict"):
        write_pairs(path, [Pair("q", "d"), {"query": "q", "document": "d"}])
    assert not path.exists()


def test_a_file_without_newlines_is_refused_after_one_line(tmp_path, monkeypatch):
    """A line past MAX_LINE_BYTES (a file of no newlines: /dev/zero) is refused, never read whole."""
    from uform.pairs import jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 64)
    path = _file(tmp_path, '{"query": "a", "document": "b"}\n' + "x" * 100)
    with pytest.raises(PairFormatError, match=r":2: a line longer than 64 bytes"):
        read_pairs(path)
    with pytest.raises(PairFormatError, match=r"/dev/zero:1: a line longer than 64 bytes"):
        read_pairs("/dev/zero")
