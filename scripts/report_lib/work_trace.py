"""Where the CPU goes during voice turns: a trace of every model call (Whisper decodes, Smart Turn, LM passes, Piper
renders) on one clock, and what each kind costs alone and beside the others.

The latency report's stages say how long the user waited for each step; they cannot say why a step took that long.
On a 2-core machine the answer is usually another model running at the same time: a Smart Turn verdict computed beside
the likely-final decode, a Piper render beside an LM pass. `instrument` watches the spans the model calls mark
(model/process/watch.py) for the duration of a `with` block and records one `Interval` per call; `work_summary` then
groups each kind's calls by the company they kept, which shows the contention directly: "LM pass: 82 ms alone, 131 ms
while Smart Turn runs".

`python scripts/latency_report.py --trace` writes the intervals (trace.json) and the summary (trace.md).
"""

from __future__ import annotations

import bisect
import contextlib
import statistics
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from model.process import watch

# Kinds of work, in the order the summary lists them.
LIKELY_FINAL = "ASR likely final"
ASR_PARTIAL = "ASR partial"
ASR_FINAL = "ASR final"
SMART_TURN = "Smart Turn"
LM_PASS = "LM pass"
LM_PREFILL = "LM prefill"
TTS_RENDER = "TTS render"
KINDS = (LIKELY_FINAL, ASR_PARTIAL, ASR_FINAL, SMART_TURN, LM_PREFILL, LM_PASS, TTS_RENDER)

# Another kind is counted as company when it covers at least this share of a call's duration.
COMPANY_SHARE = 0.25
# Calls shorter than this did no work (a prefill with nothing left to encode, a render's later chunks, which are slices
# of audio already made) and are left out of the summary.
MIN_MS = 0.5


@dataclass(frozen=True, slots=True)
class Interval:
    kind: str
    start_ns: int
    end_ns: int

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


class WorkTrace:
    """Intervals recorded from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.intervals: list[Interval] = []

    def add(self, kind: str, start_ns: int, end_ns: int) -> None:
        with self._lock:
            self.intervals.append(Interval(kind, start_ns, end_ns))

    def as_json(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(interval) for interval in sorted(self.intervals, key=lambda i: i.start_ns)]


def covered_ns(interval: Interval, others: Sequence[Interval]) -> int:
    """How much of `interval` the union of `others` covers, in ns."""
    pieces = sorted((max(o.start_ns, interval.start_ns), min(o.end_ns, interval.end_ns)) for o in others)
    total, reach = 0, interval.start_ns
    for start, end in pieces:
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


class _KindIndex:
    """The intervals of each kind sorted by start, for finding those that overlap a call without scanning them all."""

    def __init__(self, intervals: Sequence[Interval]) -> None:
        self.by_kind: dict[str, list[Interval]] = {}
        for interval in sorted(intervals, key=lambda i: i.start_ns):
            self.by_kind.setdefault(interval.kind, []).append(interval)
        self.starts = {kind: [i.start_ns for i in calls] for kind, calls in self.by_kind.items()}
        # the longest call of each kind bounds how far back an overlapping call can start
        self.longest = {kind: max(i.end_ns - i.start_ns for i in calls) for kind, calls in self.by_kind.items()}

    def overlapping(self, kind: str, interval: Interval) -> list[Interval]:
        calls = self.by_kind.get(kind, [])
        lo = bisect.bisect_left(self.starts.get(kind, []), interval.start_ns - self.longest.get(kind, 0))
        hi = bisect.bisect_left(self.starts.get(kind, []), interval.end_ns)
        return [o for o in calls[lo:hi] if o.end_ns > interval.start_ns]


def company(interval: Interval, index: _KindIndex) -> tuple[str, ...]:
    """The other kinds that ran during at least `COMPANY_SHARE` of `interval` (its own kind excluded: one thread
    runs each kind, so its calls never overlap)."""
    duration = interval.end_ns - interval.start_ns
    if duration <= 0:
        return ()
    found = []
    for kind in KINDS:
        if kind == interval.kind:
            continue
        same = index.overlapping(kind, interval)
        if same and covered_ns(interval, same) >= COMPANY_SHARE * duration:
            found.append(kind)
    return tuple(found)


def work_summary(intervals: Sequence[Interval]) -> list[dict[str, Any]]:
    """Per kind: calls and median ms in all, and by company ("alone", "with Smart Turn", "with TTS render + ...")."""
    intervals = [i for i in intervals if i.ms >= MIN_MS]
    index = _KindIndex(intervals)
    rows = []
    for kind in KINDS:
        calls = index.by_kind.get(kind, [])
        if not calls:
            continue
        groups: dict[str, list[float]] = {}
        for call in calls:
            with_ = company(call, index)
            groups.setdefault("alone" if not with_ else "with " + " + ".join(with_), []).append(call.ms)
        rows.append({
            "kind": kind,
            "calls": len(calls),
            "median_ms": statistics.median(c.ms for c in calls),
            "by_company": {
                name: {"calls": len(values), "median_ms": statistics.median(values)}
                for name, values in sorted(groups.items(), key=lambda item: (item[0] != "alone", -len(item[1])))
            },
        })
    return rows


def render_summary(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| work | calls | median ms | by company: calls, median ms |",
        "|---|---|---|---|",
    ]
    for row in rows:
        parts = "; ".join(f"{name}: {g['calls']}, {g['median_ms']:.0f}" for name, g in row["by_company"].items())
        lines.append(f"| {row['kind']} | {row['calls']} | {row['median_ms']:.0f} | {parts} |")
    return "\n".join(lines)


# --- the watcher ------------------------------------------------------------------------------------------------------
# The model calls' own spans (model/process/watch.py) and the kinds they are here
SPAN_KINDS = {
    watch.ASR_LIKELY_FINAL: LIKELY_FINAL, watch.ASR_PARTIAL: ASR_PARTIAL, watch.ASR_FINAL: ASR_FINAL,
    watch.SMART_TURN: SMART_TURN, watch.LM_PASS: LM_PASS, watch.LM_PREFILL: LM_PREFILL, watch.TTS_RENDER: TTS_RENDER,
}


def record_span(trace: WorkTrace, span: watch.Span) -> None:
    """One model call's span into `trace`, when it is of a kind the trace counts."""
    kind = SPAN_KINDS.get(span.kind)
    if kind is not None:
        trace.add(kind, span.start_ns, span.end_ns)


@contextlib.contextmanager
def instrument(trace: WorkTrace) -> Iterator[WorkTrace]:
    """Record every model call of the voice pipeline into `trace` while the block runs (the calls mark their own
    spans: every session of this process is traced)."""
    with watch.watching(lambda span: record_span(trace, span)):
        yield trace
