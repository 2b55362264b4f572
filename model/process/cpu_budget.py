"""One owner of a voice process's cores: each kind of work says when it computes and on how many threads, and a
wider team for work someone is waiting on is granted here, from what the others hold at that moment.

A voice answer's first phrase is what the user waits for: its first passes and its first render come sooner on two
threads than on one (a lone row of the bundled model 7.4 ms against 12.5; Piper's first chunk of a short phrase about
60 ms against 105). But a two-thread team waits at every step for a core someone else holds, and then it is slower
than one thread (167 ms against 97 for that chunk beside one busy core). So the budget grants `wide` only where
nothing else of this process holds the cores it needs: a Whisper decode, a Smart Turn call, a Piper render, an LM
pass. Work that has ended holds nothing, so the likely final's decode hands its core to the answer's first pass by
ending, and a pass hands its cores to the next one (or to the first phrase's render, which the passes stand aside
for) the same way.

The budget knows this process's work, not other programs': llama.cpp's `n_threads` and pipecat's executors are as
blind. On a machine other programs keep busy, give the voice's work fewer threads (`--lm-threads 1`, `TTSConfig`).
Created once with the engines (voice/engines.py) and handed to each; a process without one (the API server, a
benchmark) never widens a team.
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
from collections.abc import Iterator


class Work(enum.Enum):
    """The kinds of work that share a voice process's cores."""

    LM = "lm passes"
    ASR = "whisper decodes"
    TTS = "piper renders"
    DETECTOR = "smart turn calls"


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


class CpuBudget:
    """The threads each piece of work holds while it computes, and the wider teams granted from what is left."""

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores if cores is not None else usable_cores()
        self._lock = threading.Lock()
        self._held: dict[object, tuple[Work, int]] = {}

    def holding(self) -> dict[Work, int]:
        """The threads held now, by kind of work (kinds holding none left out)."""
        with self._lock:
            held: dict[Work, int] = {}
            for work, threads in self._held.values():
                held[work] = held.get(work, 0) + threads
            return held

    @contextlib.contextmanager
    def working(self, work: Work, threads: int) -> Iterator[None]:
        """The block is `work` computing on `threads` threads: it holds them until it ends, raised or not."""
        with self.team(work, threads, threads):
            yield

    @contextlib.contextmanager
    def team(self, work: Work, usual: int, wide: int) -> Iterator[int]:
        """`working` on a team chosen as it starts: `wide` threads where the cores hold them beside everything else
        held now (`wide` <= the cores less those held), else `usual`. The choice and the hold are one step, so two
        callers at once cannot both take the same spare core. Yields the team."""
        token = object()
        with self._lock:
            held = sum(threads for _, threads in self._held.values())
            threads = wide if wide > usual and held + wide <= self.cores else usual
            self._held[token] = (work, threads)
        try:
            yield threads
        finally:
            with self._lock:
                del self._held[token]
