"""The latency report's arithmetic: summaries, the critical-path segments and the load test's verdict."""

from __future__ import annotations

import math

import pytest

from scripts.report_lib.report_math import (
    LATENCY_FIELDS,
    MARK_FIELDS,
    SEGMENTS,
    STAT_FIELDS,
    SUMMARY_FIELDS,
    change,
    largest_passing,
    segments,
    stage_sum,
    summarise,
    summary,
    turn_record,
)
from voice.latency import STAGE_NAMES, breakdown


def test_summarise_skips_unmeasured_turns() -> None:
    result = summarise([100.0, None, 300.0, math.nan, 200.0])
    assert result.count == 3
    assert (result.mean, result.p50, result.max) == (200.0, 200.0, 300.0)
    assert result.p90 == pytest.approx(280.0)
    assert result.p95 == pytest.approx(290.0)
    assert summarise([None, None]).to_json() == {
        "count": 0, "mean": None, "p50": None, "p90": None, "p95": None, "max": None
    }


def _marks(offsets_ms: dict[str, float]) -> dict[str, int]:
    start = 10_000_000_000
    return {name: start + int(value * 1e6) for name, value in offsets_ms.items()}


def test_segments_add_up_to_voice_to_voice_with_overlapping_stages() -> None:
    # early LM start: the first pass finished before the final transcript, so that stage costs 0
    marks = _marks(
        {"speech_end": 0, "asr_final": 700, "lm_first_pass": 500, "first_phrase_committed": 900,
         "tts_first_chunk": 850, "first_audio_out": 905}
    )
    latency = breakdown(marks, endpoint_detected_ns=marks["speech_end"] + 480_000_000)
    parts = segments(latency)
    assert parts is not None
    assert list(parts) == [key for key, _ in SEGMENTS]
    assert parts["endpoint_delay"] == pytest.approx(480.0)
    assert parts["asr_decode"] == pytest.approx(220.0)
    assert parts["lm_first_pass"] == 0.0
    assert sum(parts.values()) == pytest.approx(latency["voice_to_voice"])
    assert stage_sum(latency) == pytest.approx(905.0)


def test_endpoint_wait_is_never_more_than_the_asr_stage() -> None:
    parts = segments({"endpoint_delay": 600.0, "asr_final": 400.0, "lm_first_pass": 100.0, "voice_to_voice": 500.0})
    assert parts is not None
    assert parts["endpoint_delay"] == 400.0 and parts["asr_decode"] == 0.0


def test_a_turn_that_never_spoke_has_no_segments() -> None:
    assert segments({"asr_final": 300.0}) is None
    assert stage_sum({"asr_final": 300.0}) is None


def test_turn_record_has_every_field_even_when_unmeasured() -> None:
    record = turn_record(1, "a.wav", "hi", "", {"asr_final": 12.5, "voice_to_voice": float("nan")}, {"hits": 2})
    assert set(record["latency_ms"]) == set(LATENCY_FIELDS)
    assert set(record["marks_ms"]) == set(MARK_FIELDS)
    assert set(record["stats"]) == set(STAT_FIELDS)
    assert record["latency_ms"]["asr_final"] == 12.5
    assert record["latency_ms"]["voice_to_voice"] is None  # NaN is not a measurement
    assert record["stats"]["hits"] == 2.0 and record["stats"]["misses"] is None
    assert record["segments_ms"] is None and record["client_voice_to_voice"] is None


def test_summary_covers_every_figure_and_speculation_totals() -> None:
    spoken = {name: 100.0 for name in STAGE_NAMES} | {"endpoint_delay": 50.0, "voice_to_voice": 500.0}
    turns = [
        turn_record(1, "a.wav", "a", "x", spoken, {"hits": 2, "misses": 1, "saved_ms": 80.0}),
        turn_record(2, "b.wav", "b", "y", spoken | {"voice_to_voice": 700.0}, {"hits": 1, "misses": 0}),
        turn_record(3, "c.wav", "", "", {}, {}, errors=["no speech detected in this clip"]),
    ]
    result = summary(turns)
    assert set(SUMMARY_FIELDS) <= set(result)
    assert result["voice_to_voice"]["count"] == 2
    assert result["voice_to_voice"]["p50"] == 600.0
    assert result["speculation"] == {"hits": 3, "misses": 1, "hit_rate": 0.75, "saved_ms_total": 80.0}
    assert result["turns"] == {"total": 3, "spoke": 2, "with_errors": 1, "early_lm_used": 0}


def test_largest_passing_needs_every_smaller_load_to_pass() -> None:
    assert largest_passing({1: 900.0, 2: 1500.0, 4: 2500.0, 8: 5000.0}, 2000.0) == 2
    assert largest_passing({1: 900.0, 2: 2100.0, 4: 1900.0}, 2000.0) == 1
    assert largest_passing({1: 2500.0, 2: 900.0}, 2000.0) is None
    assert largest_passing({1: None, 2: 100.0}, 2000.0) is None
    assert largest_passing({}, 2000.0) is None


def test_change_between_configurations() -> None:
    assert change(2000.0, 1500.0) == {"saved_ms": 500.0, "saved_percent": 25.0}
    assert change(1000.0, 1100.0) == {"saved_ms": -100.0, "saved_percent": pytest.approx(-10.0)}
    assert change(None, 1500.0) is None and change(0.0, 10.0) is None


def test_the_soak_interleaves_two_questions_then_one_recording_and_cycles_each_list() -> None:
    from scripts.report_lib.soak_inputs import interleave

    assert interleave(["q1", "q2", "q3"], ["r1", "r2"], 8) == ["q1", "q2", "r1", "q3", "q1", "r2", "q2", "q3"]
    assert interleave(["q1"], [], 3) == ["q1", "q1", "q1"]  # no recordings on this machine: questions only
