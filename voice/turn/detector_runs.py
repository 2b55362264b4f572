"""The turn detector's requests as a session runs them: each call in a worker thread (about 50 ms of CPU), and the
waits a paused turn keeps for their probabilities. The I/O half of the detector schedule: it executes `AskDetector`,
`AwaitVerdict` and `DropVerdict` (voice/turn/detector_schedule.py) and reports each probability back as
`DetectorAnswered`; whether a verdict still applies, and what it means for the turn, the session core decides
(voice/turn/session_core.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import numpy as np

from model.spare_cores import SpareCores
from voice.errors import VoiceError
from voice.listen.turn_detector import SmartTurn
from voice.turn.detector_schedule import DetectorAnswered

log = logging.getLogger(__name__)


def _retrieve(future: asyncio.Future[float]) -> None:
    if not future.cancelled():
        future.exception()


class DetectorRuns:
    """One session's detector calls in flight, by request number, and the waits for them."""

    def __init__(self, detector: SmartTurn, report: Callable[[DetectorAnswered], Awaitable[None]], name: str) -> None:
        self._detector = detector
        self._report = report  # hands a probability to the session core
        self._name = name
        self._calls: dict[int, asyncio.Future[float]] = {}  # running in a thread
        self._waits: dict[int, asyncio.Task[None]] = {}  # the requests a paused turn waits for

    def ask(self, request: int, audio: np.ndarray) -> None:
        """`AskDetector`: start the call now; nobody waits for it yet (an early verdict may never be needed)."""
        call = asyncio.ensure_future(asyncio.to_thread(self._judge, audio))
        call.add_done_callback(_retrieve)  # a verdict dropped unread must not log "never retrieved"
        self._calls[request] = call

    def _judge(self, audio: np.ndarray) -> float:
        """One call, in a worker thread. Its cores are handed over (model/spare_cores.py) once it ends: the answer's
        release waits for this verdict, so the call is the turn's own work on the way to the first phrase's render,
        not a load that render would compete with. It runs beside the likely final's decode, so without the hand-over
        the 100 ms a render looks back on often held ~0.3-0.5 of a core of it, and the first phrase took one thread
        with the other core idle."""
        with SpareCores.handing_over(self._detector.config.threads):
            return self._detector.probability(audio)

    def await_verdict(self, request: int, turn: int) -> None:
        """`AwaitVerdict`: wait for the request's probability in a task of its own, and report it."""
        self._waits[request] = asyncio.create_task(self._await(request), name=f"{self._name}-{turn}")

    def drop(self, request: int) -> asyncio.Task[None] | None:
        """`DropVerdict`: cancel the call and the wait for it; returns that wait, for the caller to wait out."""
        if (call := self._calls.pop(request, None)) is not None:
            call.cancel()
        if (wait := self._waits.pop(request, None)) is not None:
            wait.cancel()
        return wait

    def waits(self) -> list[asyncio.Task[None]]:
        """The waits still running (the session's close cancels them, delivering or not)."""
        return list(self._waits.values())

    async def _await(self, request: int) -> None:
        try:
            try:
                probability = await self._calls[request]
            except VoiceError as err:  # audio it cannot judge: the silence rule decides this pause
                log.warning("turn detector: %s", err)
                return
            finally:
                self._calls.pop(request, None)
            await self._report(DetectorAnswered(request, probability))
        finally:
            self._waits.pop(request, None)
