"""bench/bench_quality.py's --quick form as a test: on the names set (160 languages and scripts → English, held out
by English name), uform's train program and sentence-transformers trained from scratch at the same size and budget
(depth 2, hidden 128, 200 steps of 32 pairs, the same pairs, split and step draws), under its
MultipleNegativesRankingLoss and under SigLIP's loss, reading BPE tokens or, as uform does, bytes. uform must
reach a stated recall and stay ahead of every one (the figures: bench/STANDINGS.md)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_quality  # noqa: E402


def test_uform_learns_names_ahead_of_sentence_transformers_at_the_same_budget():
    args = bench_quality.arguments(["--quick"])
    rows = {name: bench_quality.run(args, name)
            for name in ("uform", "sentence_transformers", "sentence_transformers_siglip",
                         "sentence_transformers_siglip_bytes")}
    final = {name: row["final"] for name, row in rows.items()}
    assert final["uform"] >= 0.25, final
    assert final["uform"] > max(value for name, value in final.items() if name != "uform"), final
