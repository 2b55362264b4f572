"""Audio conversions every stage shares: PCM16 <-> float32, WAV reading, resampling to the 16 kHz the models want,
and streaming PCM in microphone-sized frames.

The whole pipeline works on mono float32 in [-1, 1] at `TARGET_RATE`. Anything else (another rate, stereo, 8/24/32-bit
WAV) is converted here, once, at the edge; a mistake in this module silently turns speech into nonsense transcripts, so
every bad input raises `AudioFormatError` with a message that says what was wrong.

Public API: `TARGET_RATE`, `validate_pcm16`, `pcm16_to_float32`, `float32_to_pcm16`, `check_sample_rate`, `to_mono`,
`resample`, `StreamResampler`, `read_wav`, `load_audio_16k`, `stream_pcm16`.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import soundfile
import soxr

from voice.errors import AudioFormatError

TARGET_RATE = 16_000
MIN_RATE = 8_000
MAX_RATE = 192_000


def validate_pcm16(frame: bytes) -> None:
    """Reject a PCM16 LE frame that cannot be whole samples (odd byte count) or is not bytes at all."""
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise AudioFormatError(f"PCM16 audio must be bytes, got {type(frame).__name__}")
    if len(frame) % 2:
        raise AudioFormatError(f"PCM16 frame has an odd number of bytes ({len(frame)}); each sample is 2 bytes")


def check_float32_mono(samples: object, what: str = "audio chunk") -> np.ndarray:
    """Models take mono float32 16 kHz samples; anything else is a caller bug worth a clear `AudioFormatError`."""
    if not isinstance(samples, np.ndarray):
        raise AudioFormatError(f"{what} must be a numpy array, got {type(samples).__name__}")
    if samples.ndim != 1:
        raise AudioFormatError(f"{what} must be mono (1-D), got shape {samples.shape}; mix down first")
    if samples.dtype != np.float32:
        raise AudioFormatError(f"{what} must be float32 at 16 kHz, got {samples.dtype}")
    if not np.all(np.isfinite(samples)):
        raise AudioFormatError(f"{what} contains NaN or infinite samples")
    return samples


def pcm16_to_float32(frame: bytes) -> np.ndarray:
    """PCM16 LE bytes -> float32 samples in [-1, 1)."""
    validate_pcm16(frame)
    return np.frombuffer(frame, dtype="<i2").astype(np.float32) / 32768.0


def float32_to_pcm16(samples: np.ndarray) -> bytes:
    """float32 samples -> PCM16 LE bytes; values outside [-1, 1] are clipped rather than wrapped around."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 32767.0 / 32768.0)
    return (np.round(clipped * 32768.0)).astype("<i2").tobytes()


def check_sample_rate(sample_rate: int) -> int:
    """Return the rate if it is a plausible audio rate, else raise: a wrong rate is the commonest silent failure."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer):
        raise AudioFormatError(f"sample rate must be an integer number of Hz, got {sample_rate!r}")
    if not MIN_RATE <= sample_rate <= MAX_RATE:
        raise AudioFormatError(f"unsupported sample rate {sample_rate} Hz (expected {MIN_RATE}..{MAX_RATE} Hz)")
    return int(sample_rate)


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Average the channels of a (frames, channels) array; a 1-D array is already mono."""
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim == 1:
        return samples
    if samples.ndim != 2:
        raise AudioFormatError(f"audio must be 1-D or (frames, channels), got shape {samples.shape}")
    return samples.mean(axis=1, dtype=np.float32)


def resample(samples: np.ndarray, from_rate: int, to_rate: int = TARGET_RATE) -> np.ndarray:
    """Resample a whole mono signal with soxr's high-quality filter (band-limited, so no aliasing into speech)."""
    check_sample_rate(from_rate)
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim != 1:
        raise AudioFormatError(f"resample expects mono audio, got shape {samples.shape}")
    if from_rate == to_rate:
        return samples
    return soxr.resample(samples, from_rate, to_rate, quality="HQ").astype(np.float32, copy=False)


class StreamResampler:
    """Chunk-by-chunk resampling that keeps filter state across chunks, so chunk boundaries add no clicks.

    Resampling each 20 ms chunk on its own would restart the filter at every boundary; soxr's stream keeps its history.
    """

    def __init__(self, from_rate: int, to_rate: int = TARGET_RATE) -> None:
        self.from_rate = check_sample_rate(from_rate)
        self.to_rate = to_rate
        self._stream = None if from_rate == to_rate else soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32")

    def push(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample the next mono chunk; `last=True` flushes the filter's tail."""
        samples = np.asarray(samples, dtype=np.float32)
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(samples, last=last)


def read_wav(source: str | Path | bytes) -> tuple[np.ndarray, int]:
    """Read a WAV file (path or bytes) of any common rate, channel count and sample width.

    Returns float32 samples shaped (frames, channels) and the sample rate. Empty, truncated or non-audio input raises
    `AudioFormatError` naming the source.
    """
    name = "<bytes>" if isinstance(source, bytes | bytearray) else str(source)
    if isinstance(source, bytes | bytearray):
        if not source:
            raise AudioFormatError("WAV input is empty (0 bytes)")
        handle: io.BytesIO | str = io.BytesIO(bytes(source))
    else:
        path = Path(source)
        if not path.is_file():
            raise AudioFormatError(f"WAV file not found: {path}")
        if path.stat().st_size == 0:
            raise AudioFormatError(f"WAV file is empty (0 bytes): {path}")
        handle = str(path)
    try:
        samples, rate = soundfile.read(handle, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, ValueError, TypeError) as err:
        raise AudioFormatError(f"not a readable audio file ({name}): {err}") from err
    if samples.shape[0] == 0:
        raise AudioFormatError(f"audio file has no samples: {name}")
    if not np.all(np.isfinite(samples)):
        raise AudioFormatError(f"audio file contains NaN or infinite samples: {name}")
    return samples, check_sample_rate(int(rate))


def load_audio_16k(source: str | Path | bytes) -> np.ndarray:
    """Read a WAV file and return mono float32 at 16 kHz, the form the VAD and Whisper expect."""
    samples, rate = read_wav(source)
    return resample(to_mono(samples), rate, TARGET_RATE)


async def stream_pcm16(
    send: Callable[[bytes], Awaitable[object]],
    pcm: bytes,
    *,
    rate: int = TARGET_RATE,
    frame_ms: int = 20,
    realtime: bool = False,
    speed: float = 1.0,
) -> None:
    """Hand PCM16 to `send` in `frame_ms` frames, as a microphone callback delivers it (file mode, reports, tests).

    With `realtime` each frame is sent when it would have been recorded (`speed` times faster when asked), so the
    streaming ASR, the endpointer and the early LM start behave as they do live; otherwise frames go as fast as `send`
    takes them, yielding to the event loop between frames so the pipeline's tasks keep up.
    """
    frame_bytes = rate * frame_ms // 1000 * 2
    loop = asyncio.get_running_loop()
    started = loop.time()
    for index, offset in enumerate(range(0, len(pcm), frame_bytes)):
        await send(pcm[offset : offset + frame_bytes])
        if realtime:
            due = started + (index + 1) * frame_ms / 1000 / speed
            await asyncio.sleep(max(0.0, due - loop.time()))
        else:
            await asyncio.sleep(0)
