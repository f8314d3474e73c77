"""Spoken words, offline: the numbers zero to ninety-nine, spoken by eSpeak NG in seven English voices.

Where the ``espeak-ng`` program is installed (Debian's ``espeak-ng`` package), each number word
("forty two") is rendered by each of :data:`VOICES` at two speeds and two pitches: 28 WAV
recordings a word, 2,800 in all (about 15 s on two cores), each captioned by its words. The
held-out recordings are those of :data:`HELD_OUT_VOICE`, a voice no training recording has: the task is to recognise a known word
from an unheard speaker, classification among the hundred captions (as digits' zero-shot task is
among ten). Where ``espeak-ng`` is missing, :func:`spoken_pairs` refuses with a message that says
how to install it.

Licence: eSpeak NG and its voices are GPL-3.0-or-later; the recordings are made on the machine, none
is kept in this repository.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import ErrorCode, UFormError

VOICES = ("en-us", "en-gb", "en-gb-x-rp", "en-029", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-gb-scotland")
"""eSpeak NG's own English voices (no MBROLA voices, which need another package)."""
HELD_OUT_VOICE = "en-gb-scotland"
SPEEDS = (150, 200)
"""Words a minute."""
PITCHES = (35, 65)
"""eSpeak's pitch adjustment, 0..99."""
ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


@dataclass(frozen=True)
class SpokenPair:
    """One recording (WAV bytes) and the words it says."""

    audio: bytes
    caption: str
    voice: str


def number_words(count: int = 100) -> list[str]:
    """The numbers 0 … count − 1 (at most 100) in words: "zero", …, "forty two", …"""
    def words(n: int) -> str:
        if n < 20:
            return ONES[n]
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])

    return [words(n) for n in range(min(count, 100))]


def espeak() -> str:
    """The path of espeak-ng, or a refusal that says how to install it."""
    path = shutil.which("espeak-ng")
    if path is None:
        raise UFormError(ErrorCode.UNSUPPORTED, "the spoken data set needs the espeak-ng program, which this "
                                                "machine lacks (Debian: apt-get install espeak-ng)")
    return path


def speak(program: str, text: str, voice: str, speed: int, pitch: int) -> bytes:
    """WAV bytes of `text` spoken by espeak-ng in `voice` at `speed` words a minute and `pitch` (written to a file:
    its --stdout stream declares no length in its header)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "spoken.wav")
        done = subprocess.run([program, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", path, text],
                              capture_output=True, check=False, timeout=60)
        if done.returncode != 0 or not os.path.exists(path):
            said = done.stderr.decode(errors="replace").strip() or f"exit status {done.returncode}"
            raise UFormError(ErrorCode.UNSUPPORTED, f"espeak-ng could not speak {text!r} in voice {voice}: {said}")
        with open(path, "rb") as file:
            return file.read()


def spoken_pairs(words=None, voices=VOICES, speeds=SPEEDS, pitches=PITCHES) -> list[SpokenPair]:
    """Every (word, voice, speed, pitch) recording, in that nesting order (module doc); `words` defaults to the
    hundred number words. Rendered on a thread pool of espeak-ng processes."""
    program = espeak()
    settings = list(itertools.product(number_words() if words is None else words, voices, speeds, pitches))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        audio = list(pool.map(lambda setting: speak(program, *setting), settings))
    return [SpokenPair(audio=wav, caption=word, voice=voice) for wav, (word, voice, _, _) in zip(audio, settings)]
