"""Audio items on the host: decoding against soundfile + soxr called directly, frames against a
plain numpy reference, truncation, every refusal, and the synthetic sound data set."""

import functools
import io

import numpy as np
import pytest
import soundfile
import soxr

from uform.datasets import sounds
from uform.media import DecodePool, audio, mask_patches, masked_count
from uform.training.config import AudioShape
from uform.errors import ErrorCode, UFormError

RATE = 48000
FORMATS = {  # name: soundfile's (format, subtype) for the file written
    "WAV": ("WAV", "PCM_16"),
    "FLAC": ("FLAC", "PCM_24"),
    "MP3": ("MP3", "MPEG_LAYER_III"),
    "OPUS": ("OGG", "OPUS"),
}
LOSSLESS = ("WAV", "FLAC")


def stereo(seconds=0.5, rate=RATE):
    """Two different channels: a chord on the left, a quieter noisy tone on the right."""
    time = np.arange(int(seconds * rate))[:, None] / rate
    rng = np.random.default_rng(0)
    left = 0.3 * np.sin(2 * np.pi * 440 * time) + 0.2 * np.sin(2 * np.pi * 660 * time)
    right = 0.2 * np.sin(2 * np.pi * 220 * time) + 0.05 * rng.standard_normal(time.shape)
    return np.concatenate([left, right], axis=1).astype(np.float32)


def write(samples, rate, name):
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=FORMATS[name][0], subtype=FORMATS[name][1])
    return buffer.getvalue()


@pytest.fixture(scope="module")
def files():
    return {name: write(stereo(), RATE, name) for name in FORMATS}


def direct(data, sample_rate):
    """What soundfile and soxr give called by hand: float64 channel mean, rounded once, then resampled."""
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float64", always_2d=True)
    mono = samples.mean(axis=1).astype(np.float32)
    return soxr.resample(mono, rate, sample_rate, quality="HQ")


def decode(content, item):
    """``decode_audio`` at 16 kHz."""
    return audio.decode_audio(content, item, sample_rate=16000)


def refused(call, *expected):
    """Runs ``call``, expects INVALID_ARGUMENT, and answers the message checked for each ``expected`` phrase."""
    with pytest.raises(UFormError) as caught:
        call()
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT, caught.value
    for phrase in expected:
        assert phrase in caught.value.message, caught.value.message
    return caught.value.message


# Decoding.

@pytest.mark.parametrize("name", FORMATS)
def test_each_format_takes_soundfile_where_libsndfile_has_it(files, name):
    has = name in soundfile.available_formats() or name == "OPUS" and "OPUS" in soundfile.available_subtypes("OGG")
    assert audio.file_decoder(files[name]) == ("soundfile" if has else "pyav")


def test_this_libsndfile_decodes_all_four():
    # The venv's libsndfile 1.2.2 has MP3 and Opus, so PyAV is only the fallback here.
    assert all(audio.file_decoder(write(stereo(0.05), RATE, name)) == "soundfile" for name in FORMATS)


@pytest.mark.parametrize("name", FORMATS)
def test_decoding_matches_soundfile_and_soxr(files, name):
    decoded = audio.decode_audio(files[name], 0, sample_rate=16000)
    assert decoded.dtype == np.float32 and decoded.ndim == 1
    np.testing.assert_array_equal(decoded, direct(files[name], 16000))


@pytest.mark.parametrize("name", FORMATS)
def test_a_mono_file_is_soundfiles_float32_resampled(name):
    # Mono: the float64 read rounded once is soundfile's own float32 read.
    data = write(stereo()[:, 0], RATE, name)
    samples, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    expected = soxr.resample(samples, RATE, 22050, quality="HQ")
    np.testing.assert_array_equal(audio.decode_audio(data, 0, sample_rate=22050), expected)


@pytest.mark.parametrize("name", FORMATS)
def test_the_pyav_fallback_decodes_like_soundfile(files, name, monkeypatch):
    monkeypatch.setattr(audio, "_SOUNDFILE_FORMATS", frozenset())
    assert audio.file_decoder(files[name]) == "pyav"
    decoded, expected = audio.decode_audio(files[name], 0, sample_rate=16000), direct(files[name], 16000)
    assert decoded.shape == expected.shape
    # Lossless files decode to the same integers; FFmpeg's MP3 and Opus decoders are not libsndfile's
    # (mpg123, libopus), and differ by up to about 5e-5 (Opus, in its last packet).
    np.testing.assert_allclose(decoded, expected, rtol=0, atol=0 if name in LOSSLESS else 1e-4)


def test_an_array_item_is_averaged_in_float64_then_resampled():
    samples = stereo(0.3, 44100)
    expected = soxr.resample(samples.astype(np.float64).mean(axis=1).astype(np.float32), 44100, 16000, quality="HQ")
    np.testing.assert_array_equal(audio.decode_audio((samples, 44100), 0, sample_rate=16000), expected)


def test_mono_at_the_run_rate_is_kept_as_is():
    samples = stereo(0.1, 16000)[:, 1]
    np.testing.assert_array_equal(audio.decode_audio((samples, np.int64(16000)), 0, sample_rate=16000), samples)
    np.testing.assert_array_equal(audio.decode_audio((samples[:, None], 16000), 0, sample_rate=16000), samples)


# Frames and targets.

def reference_frames(samples, chunk, max_frames):
    """Frame by frame, in plain numpy: zero-padded frames, their normalised targets, the kept count."""
    count = -(-samples.size // chunk)
    frames, targets = [], []
    for index in range(min(count, max_frames)):
        frame = np.zeros(chunk, np.float32)
        piece = samples[index * chunk:(index + 1) * chunk]
        frame[:piece.size] = piece
        wide = frame.astype(np.float64)
        frames.append(frame)
        targets.append(((wide - wide.mean()) / np.sqrt(wide.var() + 1e-6)).astype(np.float32))
    return np.array(frames), np.array(targets), count


@pytest.mark.parametrize("length, chunk, max_frames", [(1000, 64, 100), (640, 64, 10), (5, 64, 3), (1000, 64, 5)])
def test_frames_and_targets_match_the_reference(length, chunk, max_frames):
    samples = np.random.default_rng(length).standard_normal(length).astype(np.float32)
    result = audio.frame_audio(samples, chunk, max_frames)
    frames, targets, count = reference_frames(samples, chunk, max_frames)
    kept = min(count, max_frames)
    assert result.frames.dtype == result.targets.dtype == np.float32 and result.frames.shape == (kept, chunk)
    np.testing.assert_array_equal(result.frames, frames)
    np.testing.assert_allclose(result.targets, targets, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(result.positions, np.arange(kept, dtype=np.int32))
    assert result.positions.dtype == np.int32
    assert result.original_frames == count and result.truncated == (count > max_frames)


def test_a_long_recording_keeps_its_first_frames():
    samples = np.arange(1000, dtype=np.float32)
    result = audio.frame_audio(samples, 64, 5)
    assert result.truncated and result.original_frames == 16
    np.testing.assert_array_equal(result.frames.reshape(-1), samples[:320])


def test_padding_and_a_silent_frame():
    result = audio.frame_audio(np.ones(70, np.float32), 64, 4)
    assert not result.truncated and result.original_frames == 2
    np.testing.assert_array_equal(result.frames[1], np.r_[np.ones(6), np.zeros(58)].astype(np.float32))
    np.testing.assert_array_equal(result.targets[0], np.zeros(64, np.float32))  # constant frame: all zero


def test_prepare_audio_runs_the_whole_path(files):
    shape = AudioShape(chunk_samples=400)  # sample_rate derives 16000
    result = audio.prepare_audio(files["FLAC"], 0, shape=shape, max_frames=8)
    expected = direct(files["FLAC"], 16000)
    assert result.original_frames == -(-expected.size // 400) == 20 and result.truncated
    np.testing.assert_array_equal(result.frames.reshape(-1), expected[:3200])


def test_frames_mask_like_patches():
    # The masked objective hides frames with the media masking, keyed by (seed, step, item).
    frames = audio.prepare_audio((stereo(1.0, 16000), 16000), 3, shape=AudioShape(chunk_samples=400), max_frames=64)
    masked = mask_patches(len(frames.positions), 0.75, 42, 7, 3)
    assert masked.shape == (40,) and masked.sum() == masked_count(40, 0.75) == 30


def test_a_decode_pool_prepares_a_steps_audio(files):
    prepare = functools.partial(audio.prepare_audio, shape=AudioShape(chunk_samples=400), max_frames=64)
    contents = list(files.values())
    with DecodePool(2) as pool:
        prepared = pool.map(prepare, contents)
        for result, content in zip(prepared, contents):
            np.testing.assert_array_equal(result.frames, prepare(content).frames)
        refused(lambda: pool.map(prepare, [contents[0], b"not audio"]), "item 1", "not a WAV")


# Refusals.

def test_audio_needs_an_audio_shape():
    refused(lambda: audio.require_audio(None, 7), "item 7", "no batch.audio")
    refused(lambda: audio.require_audio(AudioShape(), 7), "item 7", "chunk_samples 0")
    refused(lambda: audio.prepare_audio((np.ones(10, np.float32), 16000), 7, shape=AudioShape(), max_frames=4),
            "item 7")
    refused(lambda: audio.require_audio(AudioShape(chunk_samples=-4), 7), "batch.audio.chunk_samples", "-4")
    refused(lambda: audio.require_audio(AudioShape(chunk_samples=4, sample_rate=-1), 7), "batch.audio.sample_rate")
    assert audio.require_audio(AudioShape(chunk_samples=4), 7) == AudioShape(chunk_samples=4, sample_rate=16000)


def test_empty_and_unknown_files():
    refused(lambda: decode(b"", 7), "item 7", "empty")
    refused(lambda: decode(b"just some text", 7), "item 7", "not a WAV, FLAC, MP3 or Opus")
    vorbis = io.BytesIO()
    soundfile.write(vorbis, stereo(0.1), RATE, format="OGG", subtype="VORBIS")
    refused(lambda: decode(vorbis.getvalue(), 7), "item 7", "not a WAV, FLAC, MP3 or Opus")


@pytest.mark.parametrize("name, problem", [("WAV", "truncated WAV"), ("MP3", "truncated MP3"),
                                           ("FLAC", "corrupt FLAC"), ("OPUS", "corrupt OPUS")])
def test_a_file_cut_in_half(files, name, problem):
    refused(lambda: decode(files[name][:len(files[name]) // 2], 7), "item 7", problem)


@pytest.mark.parametrize("name", FORMATS)
def test_a_file_with_a_damaged_body(files, name):
    data = files[name][:48] + bytes(range(256)) * 8
    message = refused(lambda: decode(data, 7), "item 7")
    assert "corrupt" in message or "truncated" in message


def test_zero_length_audio():
    refused(lambda: decode((np.zeros(0, np.float32), 16000), 7), "item 7", "zero-length")
    refused(lambda: decode((np.zeros((0, 2), np.float32), 16000), 7), "zero-length")
    refused(lambda: decode((np.zeros((10, 0), np.float32), 16000), 7), "zero-length")
    refused(lambda: decode(write(np.zeros((0, 1), np.float32), RATE, "WAV"), 7), "zero-length")
    refused(lambda: decode((np.ones(1, np.float32), 48000), 7), "none at 16000 Hz")


def test_non_finite_samples():
    samples = stereo(0.1)
    samples[5, 1] = np.nan
    refused(lambda: decode((samples, RATE), 7), "item 7", "sample 5 of channel 1 is nan")
    samples[5, 1] = -np.inf
    refused(lambda: decode((samples[:, 1], RATE), 7), "sample 5 of channel 0 is -inf")
    floats = io.BytesIO()
    soundfile.write(floats, samples, RATE, format="WAV", subtype="FLOAT")
    refused(lambda: decode(floats.getvalue(), 7), "item 7", "not finite")


@pytest.mark.parametrize("rate", [0, -16000, 16000.5, True, "16000"])
def test_a_bad_sample_rate(rate):
    refused(lambda: decode((np.ones(10, np.float32), rate), 7), "item 7", "positive integer")


@pytest.mark.parametrize("samples, problem", [
    (np.ones(10, np.float64), "dtype float64"),
    (np.ones(10, np.int16), "dtype int16"),
    (np.ones((2, 3, 4), np.float32), "shape (2, 3, 4)"),
    (np.float32(1.0), "numpy float32 array"),
    ([0.0, 0.1], "numpy float32 array"),
])
def test_a_bad_array(samples, problem):
    refused(lambda: decode((samples, 16000), 7), "item 7", problem)


@pytest.mark.parametrize("item", ["a caption, not a sound", (np.ones(4, np.float32),), 42])
def test_neither_bytes_nor_a_tuple(item):
    refused(lambda: decode(item, 7), "item 7", "file bytes or a (samples, sample_rate) tuple")


def test_max_frames_must_be_positive():
    refused(lambda: audio.frame_audio(np.ones(10, np.float32), 4, 0), "max_frames")


# The synthetic sounds.

def test_sound_captions_are_many_and_distinct():
    captions = [recipe.caption for recipe in sounds.RECIPES]
    assert sounds.CAPTION_COUNT == len(set(captions)) >= 1000
    for example in ("a loud low tone on A", "a rising sweep", "a major chord on C", "a short burst of noise",
                    "a slow falling sweep in the high range", "three long bursts of hissing noise"):
        assert example in captions


def test_sound_pairs_are_deterministic_and_decode():
    pairs = sounds.sound_pairs(12, seed=5)
    again = sounds.sound_pairs(8, seed=5, file_format="FLAC")
    assert len({pair.caption for pair in pairs}) == 12
    assert [pair.caption for pair in pairs[:8]] == [pair.caption for pair in again]
    assert [pair.audio for pair in pairs[:8]] == [pair.audio for pair in sounds.sound_pairs(8, seed=5)]
    assert [pair.audio for pair in pairs] != [pair.audio for pair in sounds.sound_pairs(12, seed=6)]
    shape = AudioShape(chunk_samples=320)
    for wav, flac in zip(pairs, again):
        assert audio.file_decoder(wav.audio) == "soundfile" and flac.audio[:4] == b"fLaC"
        decoded = decode(wav.audio, 0)
        np.testing.assert_array_equal(decoded, decode(flac.audio, 0))  # the same 16-bit samples
        words = wav.caption.split()
        peak = 0.1 if "quiet" in words else 0.8 if "loud" in words else 0.3
        assert abs(np.abs(decoded).max() - peak) < 1e-3, wav.caption
        assert audio.prepare_audio(wav.audio, 0, shape=shape, max_frames=400).frames.shape[1] == 320


def test_sounds_need_a_rate_of_8000():
    refused(lambda: sounds.sound_pairs(1, sample_rate=4000), "sample_rate", "8000")
    assert soundfile.info(io.BytesIO(sounds.sound_pairs(1, sample_rate=8000)[0].audio)).samplerate == 8000
