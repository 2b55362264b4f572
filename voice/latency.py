"""A turn's latency breakdown, folded from its named timestamps. No I/O.

Stages overlap (early LM start runs before the final transcript; speculative TTS renders before its phrase commits), so
each stage is charged only for the time it kept the turn waiting: its mark is clamped to be no earlier than the
previous one. The stage durations therefore add up exactly to voice-to-voice latency = first_audio_out - speech_end,
and a stage that finished early costs 0 ms.
"""

from __future__ import annotations

from collections.abc import Mapping

from voice.events import LATENCY_MARKS

START_MARKS = ("speech_end", "text_in")  # a spoken turn starts at speech_end, a typed one when its text arrived
# The stages on the critical path, in pipeline order: each is named by the mark that ends it, and their durations sum
# to voice_to_voice. The latency report's fields and timeline are built from this list.
STAGE_NAMES: tuple[str, ...] = LATENCY_MARKS[1:]


def breakdown(marks: Mapping[str, int], endpoint_detected_ns: int | None = None) -> dict[str, float]:
    """Milliseconds per stage on the critical path, plus `voice_to_voice` and raw offsets `at_<mark>`.

    `marks` maps latency mark names (see `voice.events.LATENCY_MARKS`, or "text_in" for typed turns) to
    `time.monotonic_ns()` stamps. Missing marks are skipped: a turn that never spoke has no voice_to_voice.
    """
    start_name = next((name for name in START_MARKS if name in marks), None)
    if start_name is None:
        return {}
    start = marks[start_name]
    result: dict[str, float] = {}
    if endpoint_detected_ns is not None and start_name == "speech_end":
        result["endpoint_delay"] = (endpoint_detected_ns - start) / 1e6
    effective = start
    for name in STAGE_NAMES:
        if name not in marks:
            continue
        result[f"at_{name}"] = (marks[name] - start) / 1e6
        stamp = max(marks[name], effective)
        result[name] = (stamp - effective) / 1e6
        effective = stamp
    if "first_audio_out" in marks:
        result["voice_to_voice"] = (marks["first_audio_out"] - start) / 1e6
    return result

