"""How many cores are free for a wider team right now: whether work someone is waiting for may take a second core.

A voice answer's first phrase is synthesised while the language model's passes stand aside (voice/speak/stage.py),
and on two threads it comes sooner: Piper's first chunk of a short phrase p50 66 ms against 112 on one thread on the
2-core EPYC, and the answer's first passes likewise (7.4 ms against 12.5). But a two-thread team waits at every step
for a core that someone else holds: with another process spinning on one core, the same chunk took 167 ms on two
threads against 97 on one. So a wider team is taken only where the cores it needs were free just before: over the
last `WINDOW_S`, the machine's busy time (/proc/stat: every process, every thread of this one) less the work that
*handed over* to what comes next (`handed_over`: a turn's final decode, which the answer follows; the turn
detector's verdict beside it, which the answer's release waits for; the LM's passes, which a lead's next pass
continues or which stand aside for its first phrase). Whatever else ran, another process or
another session's decode in this one, is taken to hold its cores still. One daemon thread per process samples
/proc/stat; where it cannot be read (not Linux) nothing is known and callers keep one thread.

`spare_cores` is the no-I/O part (samples and hand-overs in, cores out); `SpareCores` the sampler around it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

WINDOW_S = 0.1  # the moment a decision looks back on
SAMPLE_S = 0.02  # /proc/stat counts in ticks of 10 ms, so a 100 ms window of 2 cores is read to ~0.1 core
HISTORY = 16  # samples kept: more than a window's worth, so one late wake-up of the sampler still finds a start
HANDOVERS = 64  # hand-overs kept: every pass of the last window and more
MARGIN = 0.5  # a team of n threads wants at least n - MARGIN cores spare
STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class CpuSample:
    at: float  # monotonic seconds
    idle_s: float  # idle core-seconds of the machine since boot (idle + iowait)


@dataclass(frozen=True, slots=True)
class Handover:
    """Work of `threads` threads from `start` to `end` (monotonic seconds) that has handed over to what comes next."""

    start: float
    end: float
    threads: int


def spare_cores(samples: Sequence[CpuSample], cores: int, handovers: Iterable[Handover] = (),
                window_s: float = WINDOW_S) -> float | None:
    """Cores free for the work that comes next, on average from the newest sample back to the latest one at least
    `window_s` older (samples oldest first): `cores` less the busy ones, not counting the cores that `handovers` held
    within that span. None when no sample is that old."""
    if not samples:
        return None
    newest = samples[-1]
    start = next((sample for sample in reversed(samples) if newest.at - sample.at >= window_s), None)
    if start is None:
        return None
    span = newest.at - start.at
    busy = cores - (newest.idle_s - start.idle_s) / span
    handed = sum(max(0.0, min(h.end, newest.at) - max(h.start, start.at)) * h.threads for h in handovers) / span
    return min(float(cores), max(0.0, cores - max(0.0, busy - handed)))


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def read_sample(stat: Path = STAT) -> CpuSample | None:
    """The machine's idle core-seconds now, from the first ("cpu") line of /proc/stat; None where it is unreadable."""
    try:
        with stat.open("rb") as file:
            fields = file.readline().split()
        ticks = int(fields[4]) + int(fields[5])  # cpu user nice system idle iowait ...
    except (OSError, IndexError, ValueError):
        return None
    return CpuSample(time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"))


class SpareCores:
    """The process-wide sampler. Its thread starts with the first `shared()` call and samples while the process
    lives; `allows` is False for a team of two or more until a window has passed."""

    _shared: SpareCores | None = None
    _shared_lock = threading.Lock()

    def __init__(self, stat: Path = STAT, every_s: float = SAMPLE_S) -> None:
        self._stat = stat
        self._every_s = every_s
        self._samples: deque[CpuSample] = deque(maxlen=HISTORY)
        self._handovers: deque[Handover] = deque(maxlen=HANDOVERS)
        self._lock = threading.Lock()
        self.cores = os.cpu_count() or 1  # /proc/stat's idle time is the whole machine's
        self.readable = read_sample(stat) is not None
        if self.readable:
            threading.Thread(target=self._sample, name="spare-cores", daemon=True).start()

    @classmethod
    def shared(cls) -> SpareCores:
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    @classmethod
    def running(cls) -> SpareCores | None:
        """The process's sampler if something started it (a process that serves voice: voice/engines.py), else None:
        a process of API answers or benchmarks runs no sampler thread."""
        return cls._shared

    def handed_over(self, start: float, end: float, threads: int = 1) -> None:
        """Work of `threads` threads ran from `start` to `end` (monotonic seconds) on the way to what comes next."""
        with self._lock:
            self._handovers.append(Handover(start, end, threads))

    @classmethod
    @contextlib.contextmanager
    def handing_over(cls, threads: int) -> Iterator[None]:
        """The block is work of `threads` threads on the way to what comes next: timed, and handed over when it ends
        (raised or not) to the process's sampler where one runs (`running`)."""
        started = time.monotonic()
        try:
            yield
        finally:
            if (gauge := cls.running()) is not None:
                gauge.handed_over(started, time.monotonic(), threads)

    def now(self, window_s: float = WINDOW_S) -> float | None:
        """`spare_cores` up to this moment; None while nothing is known."""
        sample = read_sample(self._stat) if self.readable else None
        with self._lock:
            samples = [*self._samples, sample] if sample is not None else list(self._samples)
            handovers = list(self._handovers)
        return spare_cores(samples, self.cores, handovers, window_s)

    def allows(self, threads: int) -> bool:
        """Whether a team of `threads` finds its cores spare (always for one thread)."""
        if threads <= 1:
            return True
        if usable_cores() < threads:
            return False
        spare = self.now()
        return spare is not None and spare >= threads - MARGIN

    def _sample(self) -> None:
        while True:
            sample = read_sample(self._stat)
            if sample is not None:
                with self._lock:
                    self._samples.append(sample)
            time.sleep(self._every_s)
