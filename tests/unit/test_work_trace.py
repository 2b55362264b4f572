"""The latency report's model-call trace: interval arithmetic, grouping by company, and the spans it watches."""

from __future__ import annotations

import pytest

from model.process import watch
from scripts.report_lib.work_trace import (
    LM_PASS,
    LM_PREFILL,
    MIN_MS,
    SMART_TURN,
    TTS_RENDER,
    Interval,
    WorkTrace,
    _KindIndex,
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


def test_instrument_records_the_spans_calls_mark_even_when_they_raise_and_nothing_after_its_block() -> None:
    trace = WorkTrace()
    with instrument(trace):
        with watch.span(watch.LM_PASS):
            pass
        with pytest.raises(ValueError, match="boom"), watch.span(watch.TTS_RENDER):
            raise ValueError("boom")
        with watch.span(watch.DECODE_LAYERS):  # not a kind the trace counts
            pass
    with watch.span(watch.LM_PASS) as unwatched:  # after the block nobody watches: a span is not even made
        assert unwatched is None
    assert [i.kind for i in trace.intervals] == [LM_PASS, TTS_RENDER]
    assert all(i.end_ns >= i.start_ns for i in trace.intervals)


def test_the_batch_runner_marks_its_prefills_and_passes() -> None:
    from model.runtime.batch_runner import BatchRunner
    from tests.unit.drive import decode, speculative
    from tests.unit.test_self_speculative import adapted

    model = adapted()
    runner = BatchRunner(model, max_batch=1)
    trace = WorkTrace()
    with instrument(trace):
        try:
            refinements = decode(runner, speculative(model, [5, 6, 7, 8] * 10, 6, masks=0))
        finally:
            runner.close()  # its thread ends: the last pass's span, which ends after its answer heard of it, is in
    kinds = [i.kind for i in trace.intervals]
    assert kinds.count(LM_PREFILL) == 1 and kinds.count(LM_PASS) == len(refinements) > 1, kinds
