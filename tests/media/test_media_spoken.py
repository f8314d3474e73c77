"""The spoken data set: number words, and eSpeak NG's recordings of them where it is installed."""

import shutil

import numpy as np
import pytest

import uform
from uform.media.audio import decode_audio
from uform.datasets.spoken import number_words, spoken_pairs


def test_number_words():
    words = number_words()
    assert len(words) == len(set(words)) == 100
    assert words[:3] == ["zero", "one", "two"] and words[42] == "forty two" and words[90] == "ninety"


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (apt-get install espeak-ng)")
def test_recordings_decode_and_repeat():
    pairs = spoken_pairs(["seven", "forty two"], voices=("en-us", "en-gb"), speeds=(175,), pitches=(50,))
    assert [(p.caption, p.voice) for p in pairs] == [("seven", "en-us"), ("seven", "en-gb"), ("forty two", "en-us"),
                                                     ("forty two", "en-gb")]
    samples = decode_audio(pairs[2].audio, 0, sample_rate=8000)
    assert samples.ndim == 1 and 0.3 < samples.size / 8000 < 3 and np.abs(samples).max() > 0.05
    assert spoken_pairs(["seven"], voices=("en-us",), speeds=(175,), pitches=(50,))[0].audio == pairs[0].audio


def test_without_espeak_the_set_is_refused_clearly(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(uform.UFormError, match="apt-get install espeak-ng"):
        spoken_pairs(["one"])
