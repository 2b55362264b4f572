"""The latency report's model-call trace: interval arithmetic, grouping by company, and the wrappers."""

from __future__ import annotations

import pytest

from scripts.report_lib.work_trace import (
    LM_PASS,
    MIN_MS,
    SMART_TURN,
    TTS_RENDER,
    Interval,
    WorkTrace,
    _KindIndex,
    _timed,
    _timed_iterator,
    company,
    covered_ns,
    instrument,
    work_summary,
)

MS = 1_000_000


def span(kind: str, start_ms: float, end_ms: float) -> Interval:
    return Interval(kind, int(start_ms * MS), int(end_ms * MS))


def test_covered_counts_overlapping_others_once_and_only_inside_the_interval() -> None:
    call = span(LM_PASS, 100, 200)
    others = [span(TTS_RENDER, 50, 120), span(TTS_RENDER, 110, 130), span(TTS_RENDER, 190, 400)]
    # 100-130 and 190-200: 40 ms, the overlap of the first two counted once, nothing outside the call
    assert covered_ns(call, others) == 40 * MS
    assert covered_ns(call, []) == 0
    assert covered_ns(call, [span(TTS_RENDER, 0, 100), span(TTS_RENDER, 200, 300)]) == 0  # touching is not overlap


def test_company_needs_a_quarter_of_the_call() -> None:
    passes = [span(LM_PASS, 0, 100), span(LM_PASS, 100, 200)]
    others = [span(SMART_TURN, 80, 126), span(TTS_RENDER, 180, 190)]
    index = _KindIndex([*passes, *others])
    assert company(passes[0], index) == ()  # 20 ms of Smart Turn in the first 100: under a quarter
    assert company(passes[1], index) == (SMART_TURN,)  # 26 ms: over it; the 10 ms render is not company
    assert company(span(LM_PASS, 0, 100), _KindIndex([span(SMART_TURN, 75, 200)])) == (SMART_TURN,)  # exactly 25 %


def test_company_finds_a_long_call_that_started_well_before() -> None:
    long_render = span(TTS_RENDER, 0, 1000)
    index = _KindIndex([long_render, *[span(TTS_RENDER, 1000 + i, 1000.5 + i) for i in range(5)],
                        span(LM_PASS, 900, 950)])
    assert company(span(LM_PASS, 900, 950), index) == (TTS_RENDER,)


def test_summary_groups_each_kind_by_company_alone_first() -> None:
    intervals = [
        span(LM_PASS, 0, 80), span(LM_PASS, 80, 160), span(LM_PASS, 160, 290),  # the last one beside Smart Turn
        span(SMART_TURN, 170, 280),
        span(TTS_RENDER, 300, 300 + MIN_MS / 2),  # did no work: left out
    ]
    rows = {row["kind"]: row for row in work_summary(intervals)}
    assert set(rows) == {LM_PASS, SMART_TURN}
    lm = rows[LM_PASS]
    assert lm["calls"] == 3 and lm["median_ms"] == 80
    assert list(lm["by_company"]) == ["alone", f"with {SMART_TURN}"]
    assert lm["by_company"]["alone"] == {"calls": 2, "median_ms": 80}
    assert lm["by_company"][f"with {SMART_TURN}"] == {"calls": 1, "median_ms": 130}
    assert rows[SMART_TURN]["by_company"] == {f"with {LM_PASS}": {"calls": 1, "median_ms": 110}}


def test_wrappers_time_calls_and_generator_items_even_when_they_raise() -> None:
    trace = WorkTrace()

    def fails(kind: str) -> None:
        raise ValueError(kind)

    wrapped = _timed(trace, lambda kind: kind, fails)
    with pytest.raises(ValueError, match="boom"):
        wrapped("boom")
    assert [i.kind for i in trace.intervals] == ["boom"]

    def chunks():
        yield b"a"
        yield b"b"

    assert list(_timed_iterator(trace, TTS_RENDER, chunks)()) == [b"a", b"b"]
    renders = [i for i in trace.intervals if i.kind == TTS_RENDER]
    assert len(renders) == 3  # each item, and the call that found the end
    assert all(i.end_ns >= i.start_ns for i in renders)
    assert [d["kind"] for d in trace.as_json()] == [i.kind for i in sorted(trace.intervals, key=lambda i: i.start_ns)]


def test_instrument_patches_the_pipeline_classes_and_restores_them() -> None:
    from model.runtime.batch_runner import BatchRunner
    from voice.listen.stage import ListenStage
    from voice.listen.turn_detector import SmartTurn
    from voice.speak.tts import PiperSynthesizer

    targets = [(ListenStage, "_locked_process"), (ListenStage, "_locked_finish"), (SmartTurn, "is_complete"),
               (BatchRunner, "_pass"), (BatchRunner, "_encode"), (PiperSynthesizer, "synthesize")]
    before = [owner.__dict__[name] for owner, name in targets]
    with pytest.raises(RuntimeError), instrument(WorkTrace()):
        assert all(owner.__dict__[n] is not original for (owner, n), original in zip(targets, before, strict=True))
        raise RuntimeError("the block failed")
    assert all(owner.__dict__[n] is original for (owner, n), original in zip(targets, before, strict=True))
