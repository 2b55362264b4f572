"""The latency report's arithmetic: one turn's record, the critical-path segments of its timeline, and summaries
(percentiles, report_lib/stats.py) over many turns. No I/O, no models, so the figures in the report can be unit-tested.

A turn's `latency_ms` (voice.latency.breakdown, or the `turn_end` message of the WebSocket protocol) already charges
each stage only for the time it kept the user waiting, so the stage durations add up to voice-to-voice. The endpoint
delay is part of the `asr_final` stage (the final transcript can only come after the endpointer decided); the report
shows it as its own segment and the remainder as "ASR final decode", so the timeline still adds up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scripts.report_lib.stats import percentile
from voice.latency import STAGE_NAMES

# Every latency figure a turn record carries, in ms (None when the turn could not measure it); the stages are
# voice.latency.STAGE_NAMES.
LATENCY_FIELDS: tuple[str, ...] = ("endpoint_delay", *STAGE_NAMES, "voice_to_voice")
MARK_FIELDS: tuple[str, ...] = tuple(f"at_{name}" for name in STAGE_NAMES)
STAT_FIELDS: tuple[str, ...] = (
    "tokens",
    "passes",
    "tokens_per_pass",
    "lm_seconds",
    "tokens_per_second",
    "hits",
    "misses",
    "saved_ms",
    "wasted_ms",
    "early_lm",
    "prompt_tokens",
    "prompt_tokens_encoded",
    "speculations",
    "speculations_dropped",
    # local mode only (the speaker callback's flags; see voice/modes/local.py); None for socket and in-process runs
    "output_underflows",
    "audible_underflows",
    "input_overflows",
)
# The figures summarised over turns (percentiles); client_voice_to_voice exists only for WebSocket runs.
SUMMARY_FIELDS: tuple[str, ...] = (
    *LATENCY_FIELDS,
    "client_voice_to_voice",
    "tokens_per_second",
    "tokens_per_pass",
    "hits",
    "misses",
    "saved_ms",
)
PERCENTILES: tuple[int, ...] = (50, 90, 95)
# The timeline's segments: the endpoint wait split out of the ASR stage, then the other stages.
SEGMENTS: tuple[tuple[str, str], ...] = (
    ("endpoint_delay", "endpoint wait"),
    ("asr_decode", "ASR final decode"),
    ("lm_first_pass", "LM first pass"),
    ("first_phrase_committed", "first phrase committed"),
    ("tts_first_chunk", "TTS first chunk"),
    ("first_audio_out", "audio out"),
)


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution of one figure over the turns that measured it."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    max: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "mean": self.mean,
            "p50": self.p50,
            "p90": self.p90,
            "p95": self.p95,
            "max": self.max,
        }


def summarise(values: Iterable[float | None]) -> Summary:
    """Summary of the finite values (None and NaN are turns that did not measure this figure)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return Summary(0, None, None, None, None, None)
    p50, p90, p95 = (percentile(finite, q) for q in PERCENTILES)
    return Summary(len(finite), sum(finite) / len(finite), p50, p90, p95, max(finite))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def turn_record(
    index: int,
    source: str,
    transcript: str,
    answer: str,
    latency_ms: Mapping[str, Any],
    stats: Mapping[str, Any],
    errors: Sequence[str] = (),
    client_voice_to_voice: float | None = None,
) -> dict[str, Any]:
    """One turn of the report with every field present (None where the turn did not measure it)."""
    return {
        "index": index,
        "source": source,
        "transcript": transcript,
        "answer": answer,
        "errors": list(errors),
        "latency_ms": {name: _number(latency_ms.get(name)) for name in LATENCY_FIELDS},
        "marks_ms": {name: _number(latency_ms.get(name)) for name in MARK_FIELDS},
        "stats": {name: _number(stats.get(name)) for name in STAT_FIELDS},
        "client_voice_to_voice": _number(client_voice_to_voice),
        "stage_sum_ms": stage_sum(latency_ms),
        "segments_ms": segments(latency_ms),
    }


def stage_sum(latency_ms: Mapping[str, Any]) -> float | None:
    """Sum of the stage durations (equals voice_to_voice up to rounding); None when the turn never spoke."""
    if _number(latency_ms.get("voice_to_voice")) is None:
        return None
    return sum(_number(latency_ms.get(name)) or 0.0 for name in STAGE_NAMES)


def segments(latency_ms: Mapping[str, Any]) -> dict[str, float] | None:
    """The timeline's segments (see SEGMENTS) in ms; they add up to the stage sum. None when the turn never spoke.

    The endpoint wait is taken out of the ASR stage but never more than that stage held: for a typed turn, or when
    the final transcript came out of an earlier decode, the ASR stage may be shorter than the endpoint delay.
    """
    if stage_sum(latency_ms) is None:
        return None
    asr = _number(latency_ms.get("asr_final")) or 0.0
    endpoint = min(max(_number(latency_ms.get("endpoint_delay")) or 0.0, 0.0), asr)
    result = {"endpoint_delay": endpoint, "asr_decode": asr - endpoint}
    for name in STAGE_NAMES[1:]:
        result[name] = _number(latency_ms.get(name)) or 0.0
    return result


def summary(turns: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-figure summaries over turn records (SUMMARY_FIELDS), plus the speculation totals."""
    result: dict[str, dict[str, Any]] = {}
    for name in SUMMARY_FIELDS:
        result[name] = summarise(_field(turn, name) for turn in turns).to_json()
    hits = sum(_field(turn, "hits") or 0.0 for turn in turns)
    misses = sum(_field(turn, "misses") or 0.0 for turn in turns)
    result["speculation"] = {
        "hits": int(hits),
        "misses": int(misses),
        "hit_rate": hits / (hits + misses) if hits + misses else None,
        "saved_ms_total": sum(_field(turn, "saved_ms") or 0.0 for turn in turns),
    }
    result["turns"] = {
        "total": len(turns),
        "spoke": sum(1 for turn in turns if _field(turn, "voice_to_voice") is not None),
        "with_errors": sum(1 for turn in turns if turn.get("errors")),
        "early_lm_used": sum(1 for turn in turns if (_field(turn, "early_lm") or 0.0) > 0.0),
    }
    # Speculative end of turn: answers started at a pause; adopted unless the user went on speaking.
    started = sum(_field(turn, "speculations") or 0.0 for turn in turns)
    dropped = sum(_field(turn, "speculations_dropped") or 0.0 for turn in turns)
    result["end_of_turn_speculation"] = {
        "started": int(started),
        "dropped": int(dropped),
        "adoption_rate": (started - dropped) / started if started else None,
    }
    return result


def _field(turn: Mapping[str, Any], name: str) -> float | None:
    if name == "client_voice_to_voice":
        return _number(turn.get(name))
    if name in STAT_FIELDS:
        return _number(turn["stats"].get(name))
    return _number(turn["latency_ms"].get(name))


def largest_passing(p95_by_n: Mapping[int, float | None], bound_ms: float) -> int | None:
    """The largest client count whose p95 stays under `bound_ms`, with every smaller count passing too (a load
    level only counts when the way up to it held); None when even the smallest fails or nothing was measured."""
    best: int | None = None
    for n in sorted(p95_by_n):
        p95 = p95_by_n[n]
        if p95 is None or p95 >= bound_ms:
            break
        best = n
    return best


def change(baseline: float | None, candidate: float | None) -> dict[str, float] | None:
    """How much `candidate` took off `baseline` (ms and percent; negative when it is slower)."""
    if baseline is None or candidate is None or baseline <= 0:
        return None
    saved = baseline - candidate
    return {"saved_ms": saved, "saved_percent": 100.0 * saved / baseline}
