"""The Realtime API's audio formats, without I/O: PCM16 at 24 kHz, G.711 mu-law and A-law at 8 kHz (telephony).

Input is decoded to PCM16 at the format's own rate and handed to the session as it is (the listener resamples to its
16 kHz); output is the TTS's PCM16 resampled at the edge, with filter state kept across chunks (`OutputEncoder`).
The G.711 codecs are the ITU tables (the same bytes as the standard library's retired `audioop`), built once in numpy.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import numpy as np

from voice.audio import StreamResampler, float32_to_pcm16, pcm16_to_float32
from voice.errors import AudioFormatError


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """One of the API's audio formats: its `type` string, sample rate and bytes per sample."""

    type: str
    rate: int
    bytes_per_sample: int

    def as_json(self) -> dict[str, object]:
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}


PCM16_24K = AudioFormat("audio/pcm", 24_000, 2)
PCMU = AudioFormat("audio/pcmu", 8_000, 1)
PCMA = AudioFormat("audio/pcma", 8_000, 1)
FORMATS = {f.type: f for f in (PCM16_24K, PCMU, PCMA)}


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 7, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 7, a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


def _ulaw_encode_table() -> np.ndarray:
    """The mu-law byte of every int16 value (indexed by the value as uint16)."""
    pcm = np.arange(65536, dtype=np.int32)
    pcm = np.where(pcm >= 32768, pcm - 65536, pcm) >> 2  # 14-bit, as G.711 specifies
    sign = np.where(pcm < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.where(pcm < 0, -pcm, pcm), 8159) + 0x21  # clip, then the bias (33 in 14 bits)
    segment = np.searchsorted(np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]), magnitude)
    value = np.where(segment >= 8, 0x7F, (np.minimum(segment, 7) << 4) | ((magnitude >> (segment + 1)) & 0x0F))
    return (value ^ sign).astype(np.uint8)


def _alaw_encode_table() -> np.ndarray:
    pcm = np.arange(65536, dtype=np.int32)
    pcm = np.where(pcm >= 32768, pcm - 65536, pcm) >> 3  # 13-bit
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    pcm = np.where(pcm >= 0, pcm, -pcm - 1)
    segment = np.searchsorted(np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF]), pcm)
    shift = np.where(segment < 2, 1, segment)
    value = np.where(segment >= 8, 0x7F, (np.minimum(segment, 7) << 4) | ((pcm >> shift) & 0x0F))
    return (value ^ mask).astype(np.uint8)


_DECODE = {PCMU.type: _ulaw_decode_table(), PCMA.type: _alaw_decode_table()}
_ENCODE = {PCMU.type: _ulaw_encode_table(), PCMA.type: _alaw_encode_table()}


def decode_base64(data: str, what: str = "audio") -> bytes:
    """The bytes of a base64 string; a clear error for anything else."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise AudioFormatError(f"{what} is not valid base64") from None


def to_pcm16(data: bytes, fmt: AudioFormat) -> bytes:
    """A client's audio in `fmt` as PCM16 LE at `fmt.rate`. Raises AudioFormatError for a partial sample."""
    if fmt.bytes_per_sample == 2:
        if len(data) % 2:
            raise AudioFormatError(f"{fmt.type} audio of {len(data)} bytes is not whole 16-bit samples")
        return data
    return _DECODE[fmt.type][np.frombuffer(data, dtype=np.uint8)].astype("<i2").tobytes()


def from_pcm16(pcm: bytes, fmt: AudioFormat) -> bytes:
    """PCM16 LE at `fmt.rate` as the bytes of `fmt`."""
    if fmt.bytes_per_sample == 2:
        return pcm
    return _ENCODE[fmt.type][np.frombuffer(pcm, dtype="<i2").view(np.uint16)].tobytes()


def samples_in(data_bytes: int, fmt: AudioFormat) -> int:
    return data_bytes // fmt.bytes_per_sample


class OutputEncoder:
    """One answer's speech, chunk by chunk: PCM16 at the TTS's rate in, the client's format out (base64)."""

    def __init__(self, from_rate: int, fmt: AudioFormat) -> None:
        self.format = fmt
        self._resampler = StreamResampler(from_rate, fmt.rate)

    def push(self, pcm: bytes, last: bool = False) -> str:
        """The next chunk (`last` flushes the resampler's tail); "" when nothing came out."""
        samples = self._resampler.push(pcm16_to_float32(pcm) if pcm else np.zeros(0, np.float32), last=last)
        if not len(samples):
            return ""
        return base64.b64encode(from_pcm16(float32_to_pcm16(samples), self.format)).decode("ascii")
