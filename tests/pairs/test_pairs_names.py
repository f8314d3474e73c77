"""The names data set: real pairs across scripts from pycountry's catalogs."""

import unicodedata

import pytest

from uform.datasets import name_pairs
from uform.pairs import split_by_document

pytest.importorskip("pycountry")


def test_names_are_many_real_pairs_across_scripts():
    pairs = name_pairs()
    assert len(pairs) >= 20_000
    assert all(p.query != p.document for p in pairs)
    scripts = {unicodedata.name(p.query[0], "?").split()[0] for p in pairs if p.query[0].isalpha()}
    assert {"LATIN", "CYRILLIC", "GREEK", "ARABIC", "HEBREW", "CJK", "DEVANAGARI"} <= scripts
    assert any(p.query == "Deutschland" and p.document == "Germany" for p in pairs)


def test_a_held_out_name_never_trains():
    train, held = split_by_document(name_pairs(), 500, seed=0)
    assert len(held) == 500
    held_documents = {p.document for p in held}
    assert not held_documents & {p.document for p in train}
    assert not {p.query for p in held} & {p.document for p in train}
