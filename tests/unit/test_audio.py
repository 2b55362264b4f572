"""PCM conversions, WAV reading, resampling to 16 kHz and streaming PCM in frames (no model)."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import pytest
import soundfile

from voice.audio import (
    StreamResampler,
    check_sample_rate,
    float32_to_pcm16,
    load_audio_16k,
    pcm16_to_float32,
    read_wav,
    resample,
    stream_pcm16,
    to_mono,
    validate_pcm16,
)
from voice.errors import AudioFormatError


def tone(frequency: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def dominant_frequency(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[np.argmax(spectrum)])


def wav_bytes(samples: np.ndarray, rate: int, subtype: str) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype=subtype)
    return buffer.getvalue()


def test_pcm16_round_trip_and_clipping():
    samples = np.array([0.0, 0.5, -0.5, -1.0, 0.999], dtype=np.float32)
    assert np.allclose(pcm16_to_float32(float32_to_pcm16(samples)), samples, atol=1 / 32768)
    loud = pcm16_to_float32(float32_to_pcm16(np.array([3.0, -3.0], dtype=np.float32)))
    assert loud[0] == pytest.approx(32767 / 32768) and loud[1] == -1.0  # clipped, not wrapped around


def test_odd_length_and_non_bytes_pcm_are_rejected():
    with pytest.raises(AudioFormatError, match="odd number of bytes"):
        validate_pcm16(b"\x00\x01\x02")
    with pytest.raises(AudioFormatError, match="must be bytes"):
        pcm16_to_float32("not bytes")  # type: ignore[arg-type]
    validate_pcm16(b"")  # an empty frame is harmless


@pytest.mark.parametrize("rate", [0, 100, 4000, 500_000, 16000.5, True])
def test_implausible_sample_rates_are_rejected(rate):
    with pytest.raises(AudioFormatError, match="sample rate"):
        check_sample_rate(rate)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_resampling_keeps_pitch_and_duration(rate):
    out = resample(tone(440.0, rate), rate)
    assert abs(out.size - 16000) <= 2
    assert dominant_frequency(out, 16000) == pytest.approx(440.0, abs=2.0)
    assert np.sqrt(np.mean(out**2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.03)


def test_stream_resampler_matches_whole_signal_resampling():
    signal = tone(300.0, 48000, 0.5) + tone(1200.0, 48000, 0.5) * 0.3
    streamer = StreamResampler(48000)
    pieces = [streamer.push(signal[i:i + 960]) for i in range(0, signal.size, 960)]
    pieces.append(streamer.push(np.zeros(0, dtype=np.float32), last=True))
    streamed = np.concatenate(pieces)
    whole = resample(signal, 48000)
    assert abs(streamed.size - whole.size) <= 2
    n = min(streamed.size, whole.size)
    assert np.max(np.abs(streamed[200:n - 200] - whole[200:n - 200])) < 1e-3  # no clicks at chunk boundaries


def test_stereo_is_mixed_down():
    left, right = tone(440.0, 16000), np.zeros(16000, dtype=np.float32)
    assert np.allclose(to_mono(np.stack([left, right], axis=1)), left / 2)
    with pytest.raises(AudioFormatError):
        to_mono(np.zeros((2, 2, 2), dtype=np.float32))


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT"])
def test_wav_of_any_sample_width_and_rate_loads_as_16k_mono(subtype):
    stereo = np.stack([tone(500.0, 44100), tone(500.0, 44100)], axis=1)
    mono16k = load_audio_16k(wav_bytes(stereo, 44100, subtype))
    assert mono16k.ndim == 1 and abs(mono16k.size - 16000) <= 2
    assert dominant_frequency(mono16k, 16000) == pytest.approx(500.0, abs=2.0)


def test_read_wav_reports_rate_and_channels(tmp_path):
    path = tmp_path / "clip.wav"
    soundfile.write(path, np.zeros((800, 2), dtype=np.float32), 8000, subtype="PCM_16")
    samples, rate = read_wav(path)
    assert rate == 8000 and samples.shape == (800, 2)


def test_empty_corrupt_and_non_audio_input_raise_clear_errors(tmp_path):
    with pytest.raises(AudioFormatError, match="empty"):
        read_wav(b"")
    empty_file = tmp_path / "empty.wav"
    empty_file.write_bytes(b"")
    with pytest.raises(AudioFormatError, match="empty"):
        read_wav(empty_file)
    good = wav_bytes(tone(440.0, 16000, 0.1), 16000, "PCM_16")
    with pytest.raises(AudioFormatError, match="not a readable audio file"):
        read_wav(good[:30])  # truncated inside the header
    with pytest.raises(AudioFormatError, match="not a readable audio file"):
        read_wav(b"this is a text file, not audio" * 10)
    with pytest.raises(AudioFormatError, match="no samples"):
        read_wav(wav_bytes(np.zeros(0, dtype=np.float32), 16000, "PCM_16"))
    with pytest.raises(AudioFormatError, match="not found"):
        read_wav(tmp_path / "missing.wav")


def test_stream_pcm16_sends_microphone_sized_frames_and_paces_them_in_real_time():
    pcm = bytes(range(256)) * 25  # 6400 bytes: 200 ms at 16 kHz

    async def frames(**pacing) -> tuple[list[bytes], float]:
        sent: list[bytes] = []

        async def send(frame: bytes) -> None:
            sent.append(frame)

        started = time.monotonic()
        await stream_pcm16(send, pcm, **pacing)
        return sent, time.monotonic() - started

    fast, fast_s = asyncio.run(frames())
    assert [len(frame) for frame in fast] == [640] * 10 and b"".join(fast) == pcm and fast_s < 0.1
    slices, _ = asyncio.run(frames(rate=8000, frame_ms=30))
    assert [len(frame) for frame in slices] == [480] * 13 + [160]  # the last frame holds what is left
    paced, paced_s = asyncio.run(frames(realtime=True, speed=2.0))
    assert paced == fast and 0.09 <= paced_s < 0.5  # 200 ms of audio at twice real time
