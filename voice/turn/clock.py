"""The wall clock for the turn-taking core, which reads no clock itself.

While the user holds or contests the floor (speaking, paused, a sound during playback) the clock feeds the core a
`ClockTick` every `CLOCK_TICK_S`: the wall time, and how long the session has waited for the client's audio. So a
client that stops sending audio still gets its turn ended, and a paused answer resumes when no word follows. An idle
session does not tick: the task runs only while the core is in one of `CLOCKED_STATES`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from voice.turn.machine_events import ClockTick, State, TurnEvent

CLOCK_TICK_S = 0.1  # how often the turn-taking core hears the wall clock while the user holds or contests the floor
CLOCKED_STATES = (State.USER_SPEAKING, State.USER_PAUSED, State.BARGE_IN_PENDING)


class HasFloorState(Protocol):
    """Who holds the floor now (the turn machine's state; the session core's is the same)."""

    @property
    def state(self) -> State: ...


class TurnClock:
    """Ticks `machine` through `dispatch` while its state needs the clock; tracks when audio last arrived."""

    def __init__(self, machine: HasFloorState, dispatch: Callable[[TurnEvent], Awaitable[None]], name: str) -> None:
        self._machine = machine
        self._dispatch = dispatch
        self._name = name
        self.task: asyncio.Task[None] | None = None
        self._waiting_for_audio_since: float | None = None  # monotonic s; None while a chunk is processed

    def processing_audio(self) -> None:
        """A chunk of audio is being processed: a slow step is not a silent client."""
        self._waiting_for_audio_since = None

    def waiting_for_audio(self) -> None:
        """From now on the session waits for the client's next chunk."""
        self._waiting_for_audio_since = time.monotonic()

    def run_if_needed(self) -> None:
        """Start ticking if the core's state needs the clock and no tick task runs."""
        if self._machine.state not in CLOCKED_STATES:
            return
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CLOCK_TICK_S)
            if self._machine.state not in CLOCKED_STATES:
                return
            now = time.monotonic()
            since = self._waiting_for_audio_since
            await self._dispatch(ClockTick(now * 1000, 0.0 if since is None else (now - since) * 1000))
