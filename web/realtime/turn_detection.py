"""A Realtime session's `turn_detection`, parsed and checked without I/O, and what it means for the voice session: the
`TurnTuning` (voice/turn/tuning.py) its listener and end-of-turn rule are tuned by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from voice.listen.stage import ListenConfig
from voice.turn.tuning import TurnTuning
from web.realtime.errors import RealtimeError, Unsupported, fields, short

TURN_DETECTION_TYPES = ("server_vad", "semantic_vad")
# semantic_vad's eagerness scales the end-of-turn rule's waits after a pause as the API scales its longest wait
# (low 8 s, medium 4 s, high 2 s): medium (and auto) is the server's own rule
PATIENCE = {"low": 2.0, "medium": 1.0, "auto": 1.0, "high": 0.5}
MAX_SILENCE_MS = 10_000
MAX_PREFIX_MS = 2_000


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """`server_vad` or `semantic_vad`. Both run the session's own endpointer and end-of-turn rule (Smart Turn and the
    LM's end-of-turn probability: what the API calls semantic VAD). `server_vad`'s threshold, silence and prefix
    padding tune the endpointer (`tuning`); `semantic_vad`'s eagerness scales the rule's waits."""

    type: str = "semantic_vad"
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str = "auto"
    threshold: float | None = None
    silence_duration_ms: int | None = None
    prefix_padding_ms: int | None = None

    def tuning(self) -> TurnTuning:
        if self.type == "semantic_vad":
            return TurnTuning(patience=PATIENCE[self.eagerness])
        return TurnTuning(self.threshold, self.silence_duration_ms, self.prefix_padding_ms)

    def as_json(self, server: TurnTuning) -> dict[str, Any]:
        """As the session reports it; `server`: the server's own values, for those the client left to it."""
        out: dict[str, Any] = {"type": self.type, "create_response": self.create_response,
                               "interrupt_response": self.interrupt_response}
        if self.type == "semantic_vad":
            out["eagerness"] = self.eagerness
        else:
            applied = self.tuning()
            out.update(threshold=applied.vad_threshold if applied.vad_threshold is not None else server.vad_threshold,
                       silence_duration_ms=applied.silence_ms if applied.silence_ms is not None else server.silence_ms,
                       prefix_padding_ms=applied.prefix_ms if applied.prefix_ms is not None else server.prefix_ms,
                       idle_timeout_ms=None)
        return out


SERVER_TUNING = TurnTuning().filled(ListenConfig())  # the server's listener, unless its session says otherwise


def parse_turn_detection(value: Any) -> TurnDetection | None:
    param = "session.audio.input.turn_detection"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RealtimeError(f"{param} must be an object or null", param=param)
    kind = value.get("type")
    if kind not in TURN_DETECTION_TYPES:
        raise RealtimeError(f"turn_detection.type must be server_vad or semantic_vad, got {short(repr(kind))}",
                            param=f"{param}.type")
    common = {"type", "create_response", "interrupt_response"}
    own = {"eagerness"} if kind == "semantic_vad" else {"threshold", "silence_duration_ms", "prefix_padding_ms",
                                                        "idle_timeout_ms"}
    fields(value, param, common | own)
    if value.get("idle_timeout_ms") is not None:
        raise Unsupported("idle_timeout_ms: the server does not prompt the user after silence",
                          param=f"{param}.idle_timeout_ms")
    create = flag(value, "create_response", param)
    interrupt = flag(value, "interrupt_response", param)
    if not interrupt:
        raise Unsupported("interrupt_response false: speaking over the answer always interrupts it here",
                          param=f"{param}.interrupt_response")
    eagerness = value.get("eagerness", "auto")
    if eagerness not in PATIENCE:
        raise RealtimeError(f"eagerness must be one of {', '.join(PATIENCE)}", param=f"{param}.eagerness")
    threshold = value.get("threshold")
    if threshold is not None and (not isinstance(threshold, int | float) or isinstance(threshold, bool)
                                  or not 0.0 <= threshold <= 1.0):
        raise RealtimeError("threshold must be a number in 0..1", param=f"{param}.threshold")
    if threshold in (0.0, 1.0):
        raise Unsupported("threshold 0 or 1: the VAD's speech probability threshold must lie strictly between",
                          param=f"{param}.threshold")
    ints = {}
    for name, most in (("silence_duration_ms", MAX_SILENCE_MS), ("prefix_padding_ms", MAX_PREFIX_MS)):
        number = value.get(name)
        if number is not None and (not isinstance(number, int) or isinstance(number, bool) or number < 0):
            raise RealtimeError(f"{name} must be a non-negative integer", param=f"{param}.{name}")
        if number is not None and number > most:
            raise Unsupported(f"{name} above {most} ms is not supported", param=f"{param}.{name}")
        ints[name] = number
    return TurnDetection(kind, create, interrupt, eagerness, threshold, **ints)


def flag(obj: dict[str, Any], name: str, where: str) -> bool:
    value = obj.get(name, True)
    if not isinstance(value, bool):
        raise RealtimeError(f"{name} must be a boolean", param=f"{where}.{name}")
    return value
