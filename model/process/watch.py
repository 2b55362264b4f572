"""Spans of model work, for tools that watch it run: the latency report's trace of every model call
(scripts/report_lib/work_trace.py), the passes a benchmark counts (report_lib/passes.py), the files one pass crosses
(scripts/pass_path.py). The calls mark their spans here (`span`); a watcher registered with `watching` is told of
each span as it ends, on the thread that ran it, with the call's stack still below it. With no watcher a span costs a
truth test of a list, so the marks stay in the code that runs for users; no tool has to patch a class to see inside.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# What a span is of
ASR_LIKELY_FINAL = "asr likely final"  # the decode at the silence's onset, which an early answer starts from
ASR_PARTIAL = "asr partial"
ASR_FINAL = "asr final"
SMART_TURN = "smart turn"  # one verdict of the turn detector
LM_SUBMIT = "lm submit"  # an answer handed to the batch runner
LM_PREFILL = "lm prefill"
LM_PASS = "lm pass"  # one batched pass: its forward and each answer's decoding step
LM_FORWARD = "lm forward"  # a pass's forward through the model; its detail: the slots of the answers (and filling
# prompts) in it. It ends before any answer hears of the pass.
DECODE_LAYERS = "decode layers"  # one call of the C decode layer over some of a pass's layers
TTS_RENDER = "tts render"  # Piper rendering one sentence
GRAMMAR = "grammar"  # a constrained answer's grammar work in one decoding step (its masks and proposals)


@dataclass(slots=True)
class Span:
    kind: str
    start_ns: int
    end_ns: int = 0
    detail: Any = None  # what the marking code adds while the span runs (a pass's slots)


Watcher = Callable[[Span], None]
_watchers: list[Watcher] = []


@contextlib.contextmanager
def watching(watcher: Watcher) -> Iterator[None]:
    """`watcher` is told of every span that ends, in any thread, while the block runs."""
    _watchers.append(watcher)
    try:
        yield
    finally:
        _watchers.remove(watcher)


@contextlib.contextmanager
def span(kind: str) -> Iterator[Span | None]:
    """Mark the block as one span of `kind`; yields the span (to set its detail), or None while nobody watches."""
    if not _watchers:
        yield None
        return
    marked = Span(kind, time.perf_counter_ns())
    try:
        yield marked
    finally:
        marked.end_ns = time.perf_counter_ns()
        for watcher in tuple(_watchers):
            watcher(marked)
