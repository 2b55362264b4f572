"""Due timers' words, waiting to be said: a watch that queues each timer's announcement as it comes due, and the
queue a session says them from once nobody holds the floor (the turn machine refuses an announcement otherwise, and
it waits for the next idle moment). The session owns the saying (voice/turn/session.py `_announce`); this owns the
waiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from voice.tools.timers import Timers

# How often the watch looks for a timer set since it last slept (a timer is due at most this late).
TIMER_POLL_S = 0.25


class Announcements:
    """The announcements of one session. `on_due` is called (on the event loop) after a timer's words are queued."""

    def __init__(self, on_due: Callable[[], None], name: str) -> None:
        self._on_due = on_due
        self._name = name
        self._waiting: deque[str] = deque()
        self.task: asyncio.Task[None] | None = None  # the watch, once started

    @property
    def next(self) -> str | None:
        """The words to say next, or None when none wait."""
        return self._waiting[0] if self._waiting else None

    def said(self) -> None:
        """The next words are being said."""
        self._waiting.popleft()

    def start(self, timers: Timers) -> None:
        """Watch `timers` from now on (once)."""
        if self.task is None:
            self.task = asyncio.create_task(self._watch(timers), name=self._name)

    async def _watch(self, timers: Timers) -> None:
        """Wake when a timer is due (checking at least every `TIMER_POLL_S`: a turn may set one at any time)."""
        while True:
            wait = timers.next_due()
            await asyncio.sleep(TIMER_POLL_S if wait is None else min(wait, TIMER_POLL_S))
            for timer in timers.due():
                self._waiting.append(timer.announcement())
            self._on_due()
