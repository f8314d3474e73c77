"""The two commands of the README run end to end: the text-encoder train job and the LM demo."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import uform
from uform.pairs import Pair, write_pairs

# The commands run in a scratch folder; they must find this uform however it was installed.
ENVIRONMENT = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(Path(uform.__file__).parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]))


def run(*args, cwd, check=True):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          check=check, env=ENVIRONMENT)


def test_train_job_on_a_jsonl_file(tmp_path):
    pairs = [Pair(query=f"what does function number {i} do", document=f"def function_{i}(x, y={i})")
             for i in range(12)]
    write_pairs(tmp_path / "pairs.jsonl", pairs)
    result = run("-m", "uform", "train", "--pairs", "pairs.jsonl", "--steps", "3", "--pairs-per-step", "4",
                 "--held-out", "4", "--depth", "1", "--columns", "48", "--device", "cpu",
                 "--checkpoint", "text.safetensors", cwd=tmp_path)
    assert "8 training pairs, 4 held out" in result.stdout
    assert "held-out text→text recall@1 over 4 pairs" in result.stdout and "bag-of-bytes baseline" in result.stdout
    assert (tmp_path / "text.safetensors").stat().st_size > 0


@pytest.mark.parametrize("data,modality", [("shapes", "image"), ("sounds", "audio")])
def test_train_job_on_captioned_media(tmp_path, data, modality):
    result = run("-m", "uform", "train", "--data", data, "--examples", "40", "--steps", "2", "--pairs-per-step", "4",
                 "--held-out", "10", "--depth", "1", "--device", "cpu", "--checkpoint", "media.safetensors",
                 cwd=tmp_path)
    assert "30 training pairs, 10 held out" in result.stdout
    assert f"held-out {modality}→text recall@1 over 10 pairs" in result.stdout and "chance 0.1000" in result.stdout
    assert (tmp_path / "media.safetensors").stat().st_size > 0


def test_train_job_names_a_bad_pairs_line(tmp_path):
    (tmp_path / "pairs.jsonl").write_text('{"query": "a question here", "document": "an answer"}\n{"query": 1}\n')
    result = run("-m", "uform", "train", "--pairs", "pairs.jsonl", cwd=tmp_path, check=False)
    assert result.returncode != 0 and "pairs.jsonl:2" in result.stderr


def test_language_model_demo(tmp_path):
    result = run("-m", "uform.lm", "--steps", "3", "--device", "cpu", "--checkpoint", "lm.uformlm", cwd=tmp_path)
    assert "saved lm.uformlm" in result.stdout and "sample: def " in result.stdout
    assert (tmp_path / "lm.uformlm").stat().st_size > 0
