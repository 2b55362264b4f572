"""WebSocket protocol v1 without I/O: parse client frames into typed messages, turn pipeline events into frames.

The server shell (web/server.py) only moves bytes; every decision about what a frame means, whether it is valid and
what the client sees lives here, so it can be tested (and fuzzed) without a socket or an event loop. PROTOCOL.md is
the written contract; keep the two in step and bump `PROTOCOL_VERSION` on any incompatible change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from voice import events as ev
from voice.errors import ProtocolError


class LimitExceeded(ProtocolError):
    """A client exceeded a configured limit (message size, audio rate, text length, sessions...)."""

    code = "limit_exceeded"


PROTOCOL_VERSION = 1
DEFAULT_INPUT_SAMPLE_RATE = 16_000
MIN_INPUT_SAMPLE_RATE = 8_000
MAX_INPUT_SAMPLE_RATE = 96_000  # a browser sends its audio context's own rate; some interfaces run at 88.2 or 96 kHz
# who takes the assistant's own voice out of the client's microphone: the client (its own canceller, as every
# browser has, or a headset; the default) or the server (a device client on open speakers with none)
ECHO_CANCELLATION = ("client", "server")


@dataclass(frozen=True, slots=True)
class ProtocolLimits:
    """Per-frame limits the parser enforces; the server builds these from its WebConfig."""

    max_message_bytes: int = 64 * 1024
    max_text_chars: int = 2_000


# --- client -> server ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """Announces the sample rate of the PCM the client will send (and, optionally, the protocol it speaks and who
    cancels the echo of the assistant's voice; None: as before)."""

    sample_rate: int
    echo_cancellation: str | None = None


@dataclass(frozen=True, slots=True)
class TextTurn:
    """A typed user turn."""

    text: str


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Stop the assistant now: cancel the turn and clear queued audio."""


@dataclass(frozen=True, slots=True)
class Played:
    """How many samples of `turn`'s speech the client's speaker has really played (so far, in total): what the
    history keeps of an interrupted answer."""

    turn: int
    samples: int


@dataclass(frozen=True, slots=True)
class AudioFrame:
    """PCM16 LE mono samples at the rate of the last `hello` (16 kHz by default)."""

    pcm: bytes

    @property
    def samples(self) -> int:
        return len(self.pcm) // 2


ClientMessage = Hello | TextTurn | Interrupt | Played | AudioFrame

_HELLO_FIELDS = frozenset({"type", "sample_rate", "protocol", "echo_cancellation"})
_TEXT_FIELDS = frozenset({"type", "text"})
_INTERRUPT_FIELDS = frozenset({"type"})
_PLAYED_FIELDS = frozenset({"type", "turn", "samples"})


def parse_client_message(data: str | bytes, limits: ProtocolLimits) -> ClientMessage:
    """Parse one WebSocket message. Raises ProtocolError (or LimitExceeded) with a message fit for the client;
    never anything else, whatever the input."""
    if isinstance(data, bytes | bytearray | memoryview):
        return _parse_audio(bytes(data), limits)
    if not isinstance(data, str):
        raise ProtocolError(f"unsupported message of type {type(data).__name__}")
    return _parse_json(data, limits)


def _parse_audio(pcm: bytes, limits: ProtocolLimits) -> AudioFrame:
    if len(pcm) > limits.max_message_bytes:
        raise LimitExceeded(f"audio frame of {len(pcm)} bytes exceeds the limit of {limits.max_message_bytes} bytes")
    if not pcm:
        raise ProtocolError("empty audio frame")
    if pcm[:1] == b"{" and pcm[-1:] == b"}" and _looks_like_json(pcm):
        raise ProtocolError("JSON control messages must be sent as text frames, binary frames carry PCM16 audio")
    if len(pcm) % 2:
        raise ProtocolError(f"audio frame of {len(pcm)} bytes is not whole PCM16 samples (odd length)")
    return AudioFrame(pcm)


def _looks_like_json(data: bytes) -> bool:
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return True


def _parse_json(text: str, limits: ProtocolLimits) -> ClientMessage:
    # Measure in UTF-8 bytes: that is what travelled and what a client's limit is about.
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > limits.max_message_bytes:
        raise LimitExceeded(f"text message of {size} bytes exceeds the limit of {limits.max_message_bytes} bytes")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"invalid JSON: {_short(str(exc))}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"a text message must be a JSON object, got {_json_kind(obj)}")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError('a text message needs a string field "type" (hello, text, interrupt or played)')
    if kind == "hello":
        return _parse_hello(obj)
    if kind == "text":
        return _parse_text(obj, limits)
    if kind == "interrupt":
        _reject_unknown_fields(obj, _INTERRUPT_FIELDS)
        return Interrupt()
    if kind == "played":
        _reject_unknown_fields(obj, _PLAYED_FIELDS)
        return Played(_count(obj, "turn"), _count(obj, "samples"))
    raise ProtocolError(f"unknown message type {_short(repr(kind))}; expected hello, text, interrupt or played")


def _count(obj: dict[str, Any], name: str) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f'"{name}" must be a non-negative integer, got {_short(repr(value))}')
    return value


def _parse_hello(obj: dict[str, Any]) -> Hello:
    _reject_unknown_fields(obj, _HELLO_FIELDS)
    protocol = obj.get("protocol", PROTOCOL_VERSION)
    if protocol != PROTOCOL_VERSION or isinstance(protocol, bool):
        raise ProtocolError(f"unsupported protocol {_short(repr(protocol))}; this server speaks {PROTOCOL_VERSION}")
    rate = obj.get("sample_rate", DEFAULT_INPUT_SAMPLE_RATE)
    if isinstance(rate, float) and rate.is_integer():
        rate = int(rate)
    if not isinstance(rate, int) or isinstance(rate, bool):
        raise ProtocolError(f'"sample_rate" must be an integer, got {_json_kind(rate)}')
    if not MIN_INPUT_SAMPLE_RATE <= rate <= MAX_INPUT_SAMPLE_RATE:
        raise ProtocolError(f"sample_rate {rate} is outside {MIN_INPUT_SAMPLE_RATE}..{MAX_INPUT_SAMPLE_RATE} Hz")
    echo = obj.get("echo_cancellation")
    if echo is not None and echo not in ECHO_CANCELLATION:
        raise ProtocolError(f'"echo_cancellation" must be "client" or "server", got {_short(repr(echo))}')
    return Hello(sample_rate=rate, echo_cancellation=echo)


def _parse_text(obj: dict[str, Any], limits: ProtocolLimits) -> TextTurn:
    _reject_unknown_fields(obj, _TEXT_FIELDS)
    text = obj.get("text")
    if not isinstance(text, str):
        raise ProtocolError(f'"text" must be a string, got {_json_kind(text)}')
    if len(text) > limits.max_text_chars:
        raise LimitExceeded(f"text of {len(text)} characters exceeds the limit of {limits.max_text_chars}")
    stripped = text.strip()
    if not stripped:
        raise ProtocolError("text turn is empty")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise ProtocolError("text turn contains unpaired UTF-16 surrogates")
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        raise ProtocolError("text turn contains control characters")
    return TextTurn(text=stripped)


def _reject_unknown_fields(obj: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(k for k in obj if k not in allowed)
    if unknown:
        names = ", ".join(_short(repr(k), 40) for k in unknown[:5])
        raise ProtocolError(f"unknown field(s) for {obj['type']!r}: {names}")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- server -> client ------------------------------------------------------------------------------------------------
def ready_message(session: str, output_sample_rate: int, input_sample_rate: int, limits: ProtocolLimits,
                  echo_cancellation: str = "client") -> str:
    """The first message of every connection, repeated as the answer to each `hello`."""
    return _dumps(
        {
            "type": "ready",
            "protocol": PROTOCOL_VERSION,
            "session": session,
            "sample_rate": output_sample_rate,
            "input_sample_rate": input_sample_rate,
            "max_message_bytes": limits.max_message_bytes,
            "max_text_chars": limits.max_text_chars,
            "echo_cancellation": echo_cancellation,
        }
    )


def error_message(code: str, message: str, turn: int | None = None) -> str:
    payload: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if turn is not None:
        payload["turn"] = turn
    return _dumps(payload)


def encode_event(event: ev.Event) -> str | bytes | None:
    """The frame a client receives for a pipeline event: JSON text, PCM16 bytes for audio, or None for internal
    events (phrase commits, speculation results, latency marks) that only the latency report needs."""
    match event:
        case ev.AudioOut(pcm=pcm):
            return pcm
        case ev.SpeechStart(turn=turn):
            return _dumps({"type": "vad", "turn": turn, "state": "speech_start"})
        case ev.SpeechEnd(turn=turn, t_ns=t_ns, detected_ns=detected_ns):
            endpoint_ms = max(0.0, (detected_ns - t_ns) / 1e6)
            return _dumps({"type": "vad", "turn": turn, "state": "speech_end", "endpoint_ms": round(endpoint_ms, 1)})
        case ev.Transcript(turn=turn, text=text, committed=committed, final=final):
            return _dumps({"type": "transcript", "turn": turn, "text": text, "committed": committed, "final": final})
        case ev.DraftUpdate(turn=turn, step=step, committed=committed, draft=draft, pieces=pieces):
            return _dumps(
                {
                    "type": "draft",
                    "turn": turn,
                    "step": step,
                    "committed": committed,
                    "draft": draft,
                    "pieces": [[text, bool(done)] for text, done in pieces],
                }
            )
        case ev.AnswerDone():
            return _dumps(
                {
                    "type": "answer",
                    "turn": event.turn,
                    "text": event.text,
                    "tokens": event.tokens,
                    "passes": event.passes,
                    "lm_seconds": _finite(event.lm_seconds),
                    "finish_reason": event.finish_reason,
                }
            )
        case ev.AudioStart(turn=turn, sample_rate=rate):
            return _dumps({"type": "audio_start", "turn": turn, "sample_rate": rate})
        case ev.AudioEnd(turn=turn):
            return _dumps({"type": "audio_end", "turn": turn})
        case ev.Clear(turn=turn, reason=reason):
            return _dumps({"type": "clear", "turn": turn, "reason": reason})
        case ev.Pause(turn=turn):
            return _dumps({"type": "pause", "turn": turn})
        case ev.Resume(turn=turn):
            return _dumps({"type": "resume", "turn": turn})
        case ev.TurnEnd():
            return _dumps(
                {
                    "type": "turn_end",
                    "turn": event.turn,
                    "user_text": event.user_text,
                    "answer": event.answer,
                    "spoken": event.spoken,
                    "interrupted": event.interrupted,
                    "latency_ms": latency_on_wire(event.latency_ms),
                    "stats": {k: _finite(v, 4) for k, v in event.stats.items()},
                }
            )
        case ev.ErrorEvent(turn=turn, code=code, message=message):
            return error_message(code, message, turn)
    return None


def text_frame(event: ev.Event) -> str:
    """The JSON text frame of an event that has one (every client-facing event but `AudioOut`): the outbound queue
    files markers, clears, pauses and resumes by their text."""
    frame = encode_event(event)
    if not isinstance(frame, str):
        raise TypeError(f"{type(event).__name__} has no text frame")
    return frame


def _finite(value: float, digits: int = 3) -> float | None:
    """JSON has no NaN or infinity; a mark that never happened travels as null."""
    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return None
    return round(float(value), digits)


def latency_on_wire(latency_ms: dict[str, float]) -> dict[str, float | None]:
    """A turn's stage latencies as its client receives them in `turn_end`: ms to 0.1 ms, null for a mark that never
    happened. The metrics count the same figures, so a turn held exactly 1.5 s falls in one bucket for both."""
    return {name: _finite(value, 1) for name, value in latency_ms.items()}


def _dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
