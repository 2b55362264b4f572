"""Timers and alarms of one voice session, and the local time: a schedule with an injected clock, no I/O.

The session's shell (voice/tools/toolbox.py and voice/turn/session.py) owns the waiting: it asks `next_due` when to
wake, takes the `due` timers then and speaks them between turns. Timers live on the session, not on an answer, so a
barge-in that cancels the answer that set one leaves the timer running.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

from voice.errors import ToolError

MAX_TIMERS = 20
MAX_SECONDS = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class Timer:
    timer_id: int
    label: str
    due: float  # on the schedule's clock (seconds)
    seconds: float  # how long it was set for
    alarm: str | None = None  # "07:30" for an alarm set by the clock time

    def announcement(self) -> str:
        """What the session says when it is due."""
        if self.alarm is not None:
            return f"It's {spoken_clock(self.alarm)}: your {self.label + ' ' if self.label else ''}alarm."
        what = f"{self.label} timer" if self.label else "timer"
        return f"Your {what} for {spoken_duration(self.seconds)} is done."


class Timers:
    """One session's timers. `clock` is monotonic seconds; `wall` the local date and time (both injectable)."""

    def __init__(self, clock: Callable[[], float], wall: Callable[[], dt.datetime] | None = None) -> None:
        self._clock = clock
        self._wall = wall or (lambda: dt.datetime.now().astimezone())
        self._timers: dict[int, Timer] = {}
        self._ids = 0

    def set(self, seconds: float, label: str = "") -> Timer:
        if not 0 < seconds <= MAX_SECONDS:
            raise ToolError("a timer must run between one second and a week")
        return self._add(seconds, label.strip(), None)

    def set_alarm(self, clock_time: str, label: str = "") -> Timer:
        """An alarm at the next `clock_time` ("HH:MM", 24-hour, local time)."""
        try:
            at = dt.time.fromisoformat(clock_time.strip())
        except ValueError as error:
            raise ToolError(f"I could not read {clock_time!r} as a time of day") from error
        now = self._wall()
        when = now.replace(hour=at.hour, minute=at.minute, second=0, microsecond=0)
        if when <= now:
            when += dt.timedelta(days=1)
        return self._add((when - now).total_seconds(), label.strip(), f"{at.hour:02d}:{at.minute:02d}")

    def _add(self, seconds: float, label: str, alarm: str | None) -> Timer:
        if len(self._timers) >= MAX_TIMERS:
            raise ToolError(f"you already have {MAX_TIMERS} timers")
        self._ids += 1
        timer = Timer(self._ids, label, self._clock() + seconds, seconds, alarm)
        self._timers[timer.timer_id] = timer
        return timer

    def cancel(self, label: str = "") -> list[Timer]:
        """Cancel the timers whose label holds `label` (all of them for an empty label)."""
        label = label.strip().lower()
        gone = [t for t in self._timers.values() if label in t.label.lower() or (label and label == t.alarm)]
        if not gone:
            raise ToolError(f"there is no {label + ' ' if label else ''}timer to cancel")
        for timer in gone:
            del self._timers[timer.timer_id]
        return gone

    def pending(self) -> list[Timer]:
        return sorted(self._timers.values(), key=lambda t: t.due)

    def remaining(self, timer: Timer) -> float:
        return max(0.0, timer.due - self._clock())

    def next_due(self) -> float | None:
        """Seconds until the next timer is due (0 when one is), None when none is set."""
        pending = self.pending()
        return self.remaining(pending[0]) if pending else None

    def due(self) -> list[Timer]:
        """Take the timers that are due now, earliest first."""
        now = self._clock()
        ripe = [t for t in self.pending() if t.due <= now]
        for timer in ripe:
            del self._timers[timer.timer_id]
        return ripe

    def now(self) -> dt.datetime:
        return self._wall()


def spoken_duration(seconds: float) -> str:
    """90 -> "1 minute 30 seconds": a duration in words."""
    whole = round(seconds)
    parts = []
    for size, name in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count} {name}" + ("" if count == 1 else "s"))
    return " ".join(parts) or "0 seconds"


def spoken_clock(hh_mm: str) -> str:
    """ "07:30" -> "7:30 AM": the text normaliser reads it as a listener expects."""
    at = dt.time.fromisoformat(hh_mm)
    return f"{at.hour % 12 or 12}:{at.minute:02d} {'AM' if at.hour < 12 else 'PM'}"


def spoken_now(now: dt.datetime) -> str:
    """The local date and time as the model should repeat it."""
    return (
        f"It is {spoken_clock(now.strftime('%H:%M'))} on {now.strftime('%A, %B')} {now.day}, {now.year} "
        f"({now.tzname() or 'local time'})."
    )
