"""Audio items on the host: decoding to mono at the run's rate, and cutting into frames.

An ``AUDIO`` item is either the bytes of a WAV, FLAC, MP3 or Opus (Ogg) file, or a
tuple ``(samples, sample_rate)`` of a float32 numpy array shaped ``(samples,)`` or
``(samples, channels)`` and a positive integer rate. :func:`prepare_audio` turns one
item into :class:`AudioFrames` for a run's :class:`~uform.training.config.AudioShape`:

1. **Decoding** (:func:`decode_audio`). Files are read with soundfile (libsndfile)
   from memory, as float64. The container is told by its first bytes (``RIFF....WAVE``,
   ``fLaC``, ``OggS`` whose first packet is ``OpusHead``, an ``ID3`` tag or an MPEG
   frame sync); a format this libsndfile build lacks (Opus arrived in libsndfile
   1.0.29, MP3 in 1.1.0, and some builds leave them out) is decoded with PyAV (FFmpeg)
   instead. :func:`file_decoder` answers which one a file takes.
2. **Mono.** Channels are averaged in float64, then rounded once to float32.
3. **Resampling.** A recording at another rate than ``sample_rate`` (zero derives
   16000) is resampled with ``soxr.resample(..., quality='HQ')``: soxr's high quality
   (20-bit precision, linear phase, pass band to about 91% of the lower Nyquist
   rate), on the float32 mono signal, giving float32. A recording already at the
   rate is kept as is.
4. **Frames** (:func:`frame_audio`). Consecutive ``chunk_samples`` samples form a
   frame, in order; the last partial frame is zero-padded. A recording of more than
   ``max_frames`` frames keeps its first ``max_frames`` and is reported truncated.
5. **Targets.** Each frame's reconstruction target is the frame normalised, padding
   included: ``(x - mean) / sqrt(var + 1e-6)`` with the mean and the population
   variance over its ``chunk_samples`` samples, computed in float64 and rounded
   once to float32. Positions are the frame indices 0, 1, ... as int32.

Refused with :class:`~uform.errors.UFormError`, the message naming the item
index and the problem:

- ``INVALID_ARGUMENT``, for all of: content that is neither bytes nor an
  ``(array, rate)`` tuple; an empty file; bytes that are not a WAV, FLAC, MP3 or Opus
  file; a file the decoder rejects (corrupt); a truncated file; zero-length audio
  (no samples, no channels, or too few samples to give one at the run's rate); a
  NaN or infinite sample, in an array or a decoded file; a sample rate that is not
  a positive integer; an array of another dtype than float32 or of another rank
  than 1 or 2; and an audio item in a run whose ``BatchShape.audio`` is missing or
  has ``chunk_samples`` 0 (:func:`require_audio`). ``SHAPE_MISMATCH`` is kept for
  arrays that disagree with each other, which a single item cannot.

A file counts as truncated when it decodes to fewer samples than its header declares.
WAV declares its size (the RIFF chunk), FLAC its sample count (STREAMINFO), and MP3
only through a Xing or Info header; an Ogg or header-less MP3 file cut at a page or
frame boundary is indistinguishable from a shorter recording, and one cut inside a
packet is refused as corrupt. Files decoded by PyAV are refused when FFmpeg reports
an error and are otherwise taken as they decode.

Which frames the masked objective hides is not decided here: like image patches, it is
:func:`uform.media.masking.mask_patches` of the frame count and ``Masking.audio_mask_ratio``,
keyed by (seed, step, item).
"""

from __future__ import annotations

import io
import numbers
from dataclasses import dataclass
from functools import cached_property

import av
import numpy as np
import soundfile
import soxr

from .config import AudioShape
from ..errors import ErrorCode, UFormError
from .items import item_error, normalised_targets

RESAMPLE_QUALITY = "HQ"
"""The soxr quality recordings are resampled with."""

_SOUNDFILE_FORMATS = frozenset(
    [name for name in ("WAV", "FLAC", "MP3") if name in soundfile.available_formats()]
    + (["OPUS"] if "OPUS" in soundfile.available_subtypes("OGG") else []))
"""The file formats this libsndfile build decodes; the rest go to PyAV."""
_PYAV_SCALE = {"u8": 128.0, "s16": 2.0 ** 15, "s32": 2.0 ** 31, "flt": 1.0, "dbl": 1.0}
"""Full scale of each FFmpeg sample format (planar or packed), by which it is divided to give [-1, 1)."""


@dataclass(frozen=True)
class AudioFrames:
    """One audio item cut into frames, ready for the frontend and the masked head."""

    frames: np.ndarray
    """``(F, chunk_samples)`` float32: the resampled mono signal, the last frame zero-padded."""
    positions: np.ndarray
    """``(F,)`` int32: the frame indices 0 .. F-1."""
    truncated: bool
    """Whether the recording had more than ``max_frames`` frames and lost its tail."""
    original_frames: int
    """Frames the whole recording spans, ``ceil(samples / chunk_samples)``, before truncation."""

    @cached_property
    def targets(self) -> np.ndarray:
        """``(F, chunk_samples)`` float32: each frame normalised to zero mean and unit variance (computed when
        first read: a contrastive step never needs it)."""
        return sample_targets(self.frames)


def sample_targets(frames: np.ndarray) -> np.ndarray:
    """``(F, chunk_samples)`` float32 frames' reconstruction targets: each normalised in float64."""
    return normalised_targets(frames.astype(np.float64))


def require_audio(shape: AudioShape | None, item: int = 0) -> AudioShape:
    """The derived audio shape of a run that holds AUDIO item ``item``; refused if the run has audio off.

    Audio is off when ``BatchShape.audio`` is missing or its ``chunk_samples`` is 0.
    """
    if shape is None or shape.chunk_samples == 0:
        held = "no batch.audio" if shape is None else "batch.audio.chunk_samples 0"
        raise item_error(item, f"an AUDIO item needs an AudioShape with a positive chunk_samples; the run has {held}")
    shape = shape.derived()
    for name in ("chunk_samples", "sample_rate"):
        value = getattr(shape, name)
        if value < 0:
            raise UFormError(ErrorCode.INVALID_ARGUMENT, f"batch.audio.{name}: must be positive, got {value}")
    return shape


def file_decoder(content: bytes, item: int = 0) -> str:
    """``"soundfile"`` or ``"pyav"``: which library decodes this file; refused if it is none of the four formats."""
    return "soundfile" if _file_format(bytes(content), item) in _SOUNDFILE_FORMATS else "pyav"


def _file_format(data: bytes, item: int) -> str:
    """The container, told by the file's first bytes."""
    if not data:
        raise item_error(item, "the audio file is empty (0 bytes)")
    head = bytes(data[:36])
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "WAV"
    if head[:4] == b"fLaC":
        return "FLAC"
    if head[:4] == b"OggS" and head[28:36] == b"OpusHead":  # RFC 7845: the ID header fills the first page alone
        return "OPUS"
    if head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0
                              and head[1] & 0x06):  # an MPEG audio frame sync; layer bits 00 would be AAC (ADTS)
        return "MP3"
    raise item_error(item, f"not a WAV, FLAC, MP3 or Opus file (it begins {head[:12]!r})")


def _mp3_declares_length(data: bytes) -> bool:
    """Whether the first MPEG frame, after any ID3v2 tag, carries a Xing or Info header (a frame count)."""
    start = 0
    if data[:3] == b"ID3" and len(data) >= 10:
        size = sum((data[6 + k] & 0x7F) << (7 * (3 - k)) for k in range(4))  # four 7-bit "syncsafe" bytes
        start = 10 + size + (10 if data[5] & 0x10 else 0)
    first_frame = bytes(data[start:start + 192])
    return b"Xing" in first_frame or b"Info" in first_frame


def _read_soundfile(data: bytes, file_format: str, item: int) -> tuple[np.ndarray, int]:
    """``(samples (n, channels) float64, rate)`` decoded by libsndfile; corrupt or truncated files refused."""
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as file:
            declared, rate = file.frames, file.samplerate
            samples = file.read(dtype="float64", always_2d=True)
    except soundfile.LibsndfileError as error:
        raise item_error(item, f"corrupt {file_format} file ({error.error_string})") from None
    riff_bytes = int.from_bytes(data[4:8], "little") + 8  # libsndfile reads a cut WAV without complaint
    if file_format == "WAV" and riff_bytes > len(data):
        raise item_error(item, f"truncated WAV file: its RIFF header declares {riff_bytes} bytes, it holds {len(data)}")
    declares_length = file_format in ("FLAC", "OPUS") or file_format == "MP3" and _mp3_declares_length(data)
    if declares_length and len(samples) < declared:
        raise item_error(item, f"truncated {file_format} file: it declares {declared} samples, {len(samples)} decode")
    return samples, rate


def _read_pyav(data: bytes, file_format: str, item: int) -> tuple[np.ndarray, int]:
    """``(samples (n, channels) float64, rate)`` of the file's first audio stream, decoded by FFmpeg."""
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise item_error(item, f"corrupt {file_format} file (no audio stream)")
            stream = container.streams.audio[0]
            rate, blocks = stream.rate, []
            for frame in container.decode(stream):
                kind = frame.format.name.rstrip("p")
                if kind not in _PYAV_SCALE:
                    raise item_error(item, f"{file_format} file of sample format {frame.format.name}, not decodable")
                block = frame.to_ndarray()
                channels = len(frame.layout.channels)
                block = block.T if frame.format.is_planar else block.reshape(-1, channels)
                offset = 128.0 if kind == "u8" else 0.0
                blocks.append((block.astype(np.float64) - offset) / _PYAV_SCALE[kind])
    except av.error.FFmpegError as error:
        raise item_error(item, f"corrupt {file_format} file ({error})") from None
    if not blocks:
        raise item_error(item, f"zero-length audio: the {file_format} file decodes to no samples")
    return np.concatenate(blocks), rate


def _read_array(content: tuple, item: int) -> tuple[np.ndarray, int]:
    """``(samples (n, channels) float32, rate)`` of an ``(array, rate)`` item, its dtype, rank and rate checked."""
    samples, rate = content
    if not isinstance(samples, np.ndarray):
        raise item_error(item, f"the audio samples must be a numpy float32 array, got {type(samples).__name__}")
    if samples.dtype != np.float32:
        raise item_error(item, f"the audio array has dtype {samples.dtype}, expected float32")
    if samples.ndim not in (1, 2):
        raise item_error(item, f"the audio array has shape {samples.shape}, expected (samples,) or (samples, channels)")
    if not isinstance(rate, numbers.Integral) or isinstance(rate, bool) or rate <= 0:
        raise item_error(item, f"the sample rate must be a positive integer, got {rate!r}")
    return (samples[:, None] if samples.ndim == 1 else samples), int(rate)


def decode_audio(content, item: int = 0, *, sample_rate: int = 16000) -> np.ndarray:
    """``(n,)`` float32 mono samples at ``sample_rate`` of one AUDIO item: file bytes or ``(array, rate)``.

    ``item`` is the item's index in the step, named by every refusal. The steps and
    every refusal are in the module doc.
    """
    if isinstance(content, (bytes, bytearray, memoryview)):
        data = bytes(content)
        file_format = _file_format(data, item)
        read = _read_soundfile if file_format in _SOUNDFILE_FORMATS else _read_pyav
        samples, rate = read(data, file_format, item)
    elif isinstance(content, tuple) and len(content) == 2:
        samples, rate = _read_array(content, item)
    else:
        raise item_error(item, f"an AUDIO item is file bytes or a (samples, sample_rate) tuple, "
                                f"got {type(content).__name__}")
    if samples.size == 0:
        raise item_error(item, f"zero-length audio: {samples.shape[0]} samples of {samples.shape[1]} channels")
    bad = np.flatnonzero(~np.isfinite(samples.reshape(-1)))
    if bad.size:
        sample, channel = divmod(int(bad[0]), samples.shape[1])
        raise item_error(item, f"sample {sample} of channel {channel} is {samples[sample, channel]}, "
                                f"not finite ({bad.size} such values)")
    mono = samples.mean(axis=1, dtype=np.float64).astype(np.float32)
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality=RESAMPLE_QUALITY)
    if mono.size == 0:
        raise item_error(item, f"zero-length audio: {len(samples)} samples at {rate} Hz give none at {sample_rate} Hz")
    return mono


def frame_audio(samples: np.ndarray, chunk_samples: int, max_frames: int) -> AudioFrames:
    """Frames, targets and positions of float32 mono ``samples`` (:func:`decode_audio`'s output)."""
    if max_frames <= 0:
        raise UFormError(ErrorCode.INVALID_ARGUMENT, f"max_frames: must be positive, got {max_frames}")
    original = -(-samples.size // chunk_samples)
    kept = min(original, max_frames)
    frames = np.zeros(kept * chunk_samples, np.float32)
    frames[:min(samples.size, frames.size)] = samples[:frames.size]
    frames = frames.reshape(kept, chunk_samples)
    return AudioFrames(frames=frames, positions=np.arange(kept, dtype=np.int32),
                       truncated=original > kept, original_frames=original)


def prepare_audio(content, item: int = 0, *, shape: AudioShape | None, max_frames: int) -> AudioFrames:
    """One AUDIO item decoded, resampled and framed for a run's audio ``shape``: its whole host path.

    ``item`` is the item's index in the step, named by every refusal.
    """
    shape = require_audio(shape, item)
    return frame_audio(decode_audio(content, item, sample_rate=shape.sample_rate), shape.chunk_samples, max_frames)
