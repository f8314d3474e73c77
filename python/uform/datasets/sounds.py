"""A synthetic audio-caption data set for the demo: tones, chords, sweeps and noise, each captioned in words.

Every pair is one sound, synthesised with numpy and encoded to WAV or FLAC bytes (16-bit
PCM, mono) with soundfile, and its caption. A caption is built from the sound's
attributes, a word or none for each, so the caption names the sound's whole recipe:

- **tone** -- "a short quiet low buzzy tone on E flat": a note of the 12 named pitch
  classes in the low, middle or high octave (octaves 2, 4 and 6 of scientific pitch,
  A4 = 440 Hz), pure (a sine) or buzzy (odd harmonics 1, 3, 5, 7, 9 at 1/k, a
  square; as everywhere, a partial at or past the Nyquist frequency is left out).
- **chord** -- "a major chord on C": a major, minor or diminished triad on one of the 12
  roots in the low, middle or high octave, three equal sines.
- **sweep** -- "a rising sweep", "a slow falling sweep in the high range": an
  exponential glide over two octaves, low (110-440 Hz), middle (220-880 Hz, no words) or
  high (880-3520 Hz).
- **noise** -- "a short burst of noise", "three long bursts of hissing noise": one to
  three bursts of white, muffled (a moving average over 2 ms) or hissing (first
  differences) noise, 150 ms of silence between bursts.

Every kind takes a loudness (quiet, medium with no word, loud: peaks at 0.1, 0.3 and
0.8 of full scale) and a length (short, medium with no word, long; for sweeps fast,
medium and slow), drawn within ranges around 0.3, 0.8 and 1.8 s. The middle value of
an attribute is the one that takes no word. Tones, chords and sweeps fade in and out
over 10 ms. Within a caption the sound still varies: the exact length, a pitch jitter
of up to 10 cents, the phases and the noise, all drawn from the pair's generator.

:data:`CAPTION_COUNT` (1,755) distinct captions exist; :func:`sound_pairs` walks them in
a seeded random order, so up to that many pairs carry distinct captions, and all its
draws derive from ``seed`` alone: the same seed gives the same bytes.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass

import numpy as np
import soundfile

from ..errors import ErrorCode, UFormError

NOTE_NAMES = ("C", "C sharp", "D", "E flat", "E", "F", "F sharp", "G", "A flat", "A", "B flat", "B")
"""The 12 pitch classes as captions spell them, from C."""
REGISTERS = {"low": 2, "": 4, "high": 6}
"""The octave each register word puts a tone or chord in (scientific pitch: C4 is middle C)."""
TIMBRES = ("", "buzzy")
"""A tone is pure (no word) or buzzy."""
CHORD_INTERVALS = {"major": (0, 4, 7), "minor": (0, 3, 7), "diminished": (0, 3, 6)}
"""Semitones above the root of each triad."""
SWEEP_DIRECTIONS = ("rising", "falling")
SWEEP_RANGES = {"in the low range": 110.0, "": 220.0, "in the high range": 880.0}
"""The lowest frequency of each sweep range, in Hz; a sweep spans two octaves up from it."""
NOISE_COLOURS = ("", "muffled", "hissing")
"""White noise (no word), noise low-passed by a 2 ms moving average, or high-passed by first differences."""
BURST_COUNTS = ("a", "two", "three")
LOUDNESS = {"quiet": 0.1, "": 0.3, "loud": 0.8}
"""The peak amplitude of each loudness word."""
LENGTHS = {"short": (0.2, 0.4), "": (0.6, 1.0), "long": (1.5, 2.1)}
"""The range, in seconds, a sound of each length word lasts (a noise sound: each burst)."""
SWEEP_SPEEDS = {"short": "fast", "": "", "long": "slow"}
"""The word a sweep's caption says for each length."""
FADE_SECONDS = 0.01
BURST_GAP_SECONDS = 0.15
MUFFLE_SECONDS = 0.002
JITTER_CENTS = 10.0
MIN_SAMPLE_RATE = 8000
"""The lowest rate the sounds are synthesised at: the highest sweep (to 3520 Hz) stays below Nyquist."""


def _phrase(*words: str) -> str:
    """The words joined by spaces, empty ones left out."""
    return " ".join(word for word in words if word)


@dataclass(frozen=True)
class Recipe:
    """What one caption asks for, as its words (an empty word is the unmarked middle value)."""

    kind: str
    """``"tone"``, ``"chord"``, ``"sweep"`` or ``"noise"``."""
    length: str
    loudness: str
    detail: tuple[str, ...]
    """Per kind: tone (register, timbre, note), chord (register, quality, note), sweep (direction, range),
    noise (count, colour)."""

    @property
    def caption(self) -> str:
        if self.kind == "tone":
            register, timbre, note = self.detail
            return _phrase("a", self.length, self.loudness, register, timbre, "tone on", note)
        if self.kind == "chord":
            register, quality, note = self.detail
            return _phrase("a", self.length, self.loudness, register, quality, "chord on", note)
        if self.kind == "sweep":
            direction, span = self.detail
            return _phrase("a", SWEEP_SPEEDS[self.length], self.loudness, direction, "sweep", span)
        count, colour = self.detail
        return _phrase(count, self.length, self.loudness, "burst" if count == "a" else "bursts", "of", colour, "noise")


def _recipes() -> tuple[Recipe, ...]:
    """Every recipe, in a fixed order: each kind's attributes crossed with every length and loudness."""
    details = ([("tone", d) for d in itertools.product(REGISTERS, TIMBRES, NOTE_NAMES)]
               + [("chord", d) for d in itertools.product(REGISTERS, CHORD_INTERVALS, NOTE_NAMES)]
               + [("sweep", d) for d in itertools.product(SWEEP_DIRECTIONS, SWEEP_RANGES)]
               + [("noise", d) for d in itertools.product(BURST_COUNTS, NOISE_COLOURS)])
    return tuple(Recipe(kind=kind, length=length, loudness=loudness, detail=detail)
                 for (kind, detail), length, loudness in itertools.product(details, LENGTHS, LOUDNESS))


RECIPES = _recipes()
CAPTION_COUNT = len(RECIPES)
"""Distinct captions (and recipes) the data set holds."""


def _frequency(register: str, note: str, semitones: int = 0) -> float:
    """Equal-tempered frequency of ``note`` in ``register``'s octave, ``semitones`` above."""
    midi = 12 * (REGISTERS[register] + 1) + NOTE_NAMES.index(note) + semitones
    return 440.0 * 2.0 ** ((midi - 69) / 12)


def _faded(signal: np.ndarray, sample_rate: int) -> np.ndarray:
    """``signal`` with linear fades in and out of ``FADE_SECONDS``."""
    ramp = min(int(FADE_SECONDS * sample_rate), signal.size // 2)
    envelope = np.ones(signal.size)
    envelope[:ramp] = np.linspace(0.0, 1.0, ramp, endpoint=False)
    envelope[signal.size - ramp:] = envelope[:ramp][::-1]
    return signal * envelope


def _sines(frequencies: np.ndarray, gains: np.ndarray, seconds: float, sample_rate: int,
           rng: np.random.Generator) -> np.ndarray:
    """A sum of sines at ``frequencies`` (Hz) weighted by ``gains``, at random phases; none at or past Nyquist."""
    gains = np.where(frequencies < sample_rate / 2, gains, 0.0)
    time = np.arange(int(seconds * sample_rate)) / sample_rate
    phases = rng.uniform(0.0, 2 * np.pi, frequencies.size)
    return (gains[:, None] * np.sin(2 * np.pi * frequencies[:, None] * time + phases[:, None])).sum(axis=0)


def synthesize(recipe: Recipe, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """The float64 mono signal of ``recipe``, peaking at its loudness, its free details drawn from ``rng``."""
    seconds = rng.uniform(*LENGTHS[recipe.length])
    detune = 2.0 ** (rng.uniform(-JITTER_CENTS, JITTER_CENTS) / 1200)
    if recipe.kind == "tone":
        register, timbre, note = recipe.detail
        harmonics = np.array([1, 3, 5, 7, 9]) if timbre else np.array([1])
        signal = _faded(_sines(_frequency(register, note) * detune * harmonics, 1.0 / harmonics,
                               seconds, sample_rate, rng), sample_rate)
    elif recipe.kind == "chord":
        register, quality, note = recipe.detail
        frequencies = np.array([_frequency(register, note, step) for step in CHORD_INTERVALS[quality]]) * detune
        signal = _faded(_sines(frequencies, np.ones(3), seconds, sample_rate, rng), sample_rate)
    elif recipe.kind == "sweep":
        direction, span = recipe.detail
        low, time = SWEEP_RANGES[span] * detune, np.arange(int(seconds * sample_rate)) / sample_rate
        if direction == "falling":
            time = time[::-1]
        # f(t) = low * 4^(t / T); the phase is its integral, so the pitch glides over two octaves.
        phase = 2 * np.pi * low * seconds / np.log(4.0) * (4.0 ** (time / seconds) - 1.0)
        signal = _faded(np.sin(phase + rng.uniform(0.0, 2 * np.pi)), sample_rate)
    else:
        count, colour = recipe.detail
        white = rng.standard_normal((BURST_COUNTS.index(count) + 1, int(seconds * sample_rate)))
        if colour == "muffled":
            width = max(int(MUFFLE_SECONDS * sample_rate), 1)
            white = np.cumsum(np.pad(white, ((0, 0), (width, 0))), axis=1)
            white = (white[:, width:] - white[:, :-width]) / width
        elif colour == "hissing":
            white = np.diff(white, axis=1, prepend=0.0)
        gap = np.zeros((white.shape[0], int(BURST_GAP_SECONDS * sample_rate)))
        signal = np.concatenate([white, gap], axis=1).reshape(-1)[:-gap.shape[1]]
    return signal * (LOUDNESS[recipe.loudness] / np.abs(signal).max())


@dataclass(frozen=True)
class SoundPair:
    """One demo pair: an encoded sound and its caption."""

    audio: bytes
    """A mono 16-bit PCM WAV or FLAC file."""
    caption: str


def encode(signal: np.ndarray, sample_rate: int, file_format: str = "WAV") -> bytes:
    """``signal`` (floats in [-1, 1]) as the bytes of a mono 16-bit ``file_format`` ("WAV" or "FLAC") file.

    The samples are quantised here, ``round(x * 32767)``, so both formats hold the same
    integers (libsndfile's own float conversion differs between its WAV and FLAC writers).
    """
    buffer = io.BytesIO()
    pcm = np.round(signal * 32767).astype(np.int16)
    soundfile.write(buffer, pcm, sample_rate, format=file_format, subtype="PCM_16")
    return buffer.getvalue()


def sound_pairs(count: int, seed: int = 0, *, sample_rate: int = 16000, file_format: str = "WAV") -> list[SoundPair]:
    """``count`` pairs, the recipes in an order drawn from ``seed``, distinct for the first :data:`CAPTION_COUNT`.

    Pair ``i`` is synthesised from its own generator, keyed by ``(seed, i)``, so a
    pair does not depend on ``count``. ``sample_rate`` is at least :data:`MIN_SAMPLE_RATE`.
    """
    if sample_rate < MIN_SAMPLE_RATE:
        raise UFormError(ErrorCode.INVALID_ARGUMENT,
                         f"sample_rate: must be at least {MIN_SAMPLE_RATE}, got {sample_rate}")
    order = np.random.default_rng([seed]).permutation(CAPTION_COUNT)
    pairs = []
    for i in range(count):
        recipe = RECIPES[order[i % CAPTION_COUNT]]
        signal = synthesize(recipe, sample_rate, np.random.default_rng([seed, i]))
        pairs.append(SoundPair(audio=encode(signal, sample_rate, file_format), caption=recipe.caption))
    return pairs
