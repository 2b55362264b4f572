"""When the turn detector (Smart Turn) is asked, on what audio, and whether a verdict it gave still applies: a core
without I/O beside the turn-taking machine, driven by events and answering with actions, so the tests can follow a
pause's verdict without a model, a thread or a clock.

The detector costs about 50 ms of CPU a call. It is asked as early as the answer is: when the listener starts the
segment's likely final decode (64 ms of silence after the speech), on the audio the segment will have if the user
stays silent, in the slack before the segment ends instead of beside the answer's first LM passes. When the segment
then ends (the final transcript, the turn paused), that *early verdict* is the turn's verdict if it was judged for
the same turn on the very same audio; otherwise (the segment grew after it) it is dropped and the detector is asked
again. The early verdict is also handed over as soon as it comes (`DeliverVerdict(likely_final=True)`): with the
LM's it may release the answer before the segment ends (voice/turn/machine.py). Speech resuming makes every verdict
of the pause moot. What the detector hears is the turn's audio so far: the segments of the turn already judged and
this one, the last `max_seconds`.

The session core (voice/turn/session_core.py) says when the events happen and hands each `DeliverVerdict` to the
machine as its `TurnVerdict` (or `LikelyVerdict`); the session shell executes the rest
(voice/turn/detector_runs.py): `AskDetector` runs the detector in a thread, `AwaitVerdict` waits for that request's
probability and hands it back as `DetectorAnswered`, `DropVerdict` cancels a request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from voice.audio import TARGET_RATE
from voice.turn.machine_events import TurnVerdict


# --- events ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LikelyFinalHeard:
    """The listener starts the likely final decode of `turn`'s open segment; `segment` is that segment's audio."""

    turn: int
    segment: np.ndarray = field(compare=False)


@dataclass(frozen=True, slots=True)
class TurnPaused:
    """`turn`'s segment ended and the machine holds the turn paused: it needs a verdict on `segment`."""

    turn: int
    segment: np.ndarray = field(compare=False)


@dataclass(frozen=True, slots=True)
class UserSpoke:
    """Speech started again: whatever the detector was judging about the pause is moot."""


@dataclass(frozen=True, slots=True)
class DetectorAnswered:
    """The detector's probability that the turn is complete, for request `request`."""

    request: int
    probability: float


@dataclass(frozen=True, slots=True)
class ScheduleClosed:
    """The session closes: every request still out is dropped."""


DetectorEvent = LikelyFinalHeard | TurnPaused | UserSpoke | DetectorAnswered | ScheduleClosed


# --- actions ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AskDetector:
    """Start the detector on `audio` (in a thread); its probability is request `request`'s."""

    request: int
    audio: np.ndarray = field(compare=False)


@dataclass(frozen=True, slots=True)
class AwaitVerdict:
    """Wait for request `request`'s probability and report it as `DetectorAnswered` (a failed call reports nothing:
    the silence rule decides that pause)."""

    request: int
    turn: int


@dataclass(frozen=True, slots=True)
class DropVerdict:
    """Cancel request `request`: its verdict will not be used (and stop waiting for it, if anyone does)."""

    request: int


@dataclass(frozen=True, slots=True)
class DeliverVerdict:
    """Hand the machine this `TurnVerdict`; `likely_final`: judged on the likely final's audio while the segment is
    still open (the machine's `LikelyVerdict`), not on a pause."""

    verdict: TurnVerdict
    likely_final: bool = False


DetectorAction = AskDetector | AwaitVerdict | DropVerdict | DeliverVerdict


@dataclass(slots=True)
class _Early:
    request: int
    turn: int
    audio: np.ndarray
    probability: float | None = None  # once it answered


class DetectorSchedule:
    """One session's turn-detector requests: `handle(event) -> actions`, no I/O."""

    def __init__(self, threshold: float, max_seconds: float) -> None:
        self.threshold = threshold
        self.max_samples = int(max_seconds * TARGET_RATE)
        self._next_request = 0
        self._early: _Early | None = None  # asked at the likely final, not yet taken by a pause
        self._judging: set[int] = set()  # requests whose probability becomes a TurnVerdict
        self._turn_audio: list[np.ndarray] = []  # the audio already judged for `_audio_turn`
        self._audio_turn = 0

    def handle(self, event: DetectorEvent) -> list[DetectorAction]:
        match event:
            case LikelyFinalHeard(turn=turn, segment=segment):
                return self._likely_final(turn, segment)
            case TurnPaused(turn=turn, segment=segment):
                return self._paused(turn, segment)
            case UserSpoke() | ScheduleClosed():
                return self._drop_all()
            case DetectorAnswered(request=request, probability=probability):
                verdict = self._verdict(probability)
                actions: list[DetectorAction] = []
                if self._early is not None and self._early.request == request:
                    self._early.probability = probability
                    actions.append(DeliverVerdict(verdict, likely_final=True))
                if request in self._judging:  # else dropped while it ran, or early and no pause needs it yet
                    self._judging.discard(request)
                    actions.append(DeliverVerdict(verdict))
                return actions
        raise TypeError(f"not a detector event: {event!r}")

    def _verdict(self, probability: float) -> TurnVerdict:
        return TurnVerdict(probability > self.threshold, probability)

    def window(self, turn: int, segment: np.ndarray) -> np.ndarray:
        """What the detector hears for `turn` ending with `segment`: the turn's audio judged before and this
        segment, the last `max_seconds`."""
        earlier = self._turn_audio if self._audio_turn == turn else []
        return np.concatenate([*earlier, segment])[-self.max_samples :]

    def _likely_final(self, turn: int, segment: np.ndarray) -> list[DetectorAction]:
        actions = self._drop_early()
        audio = self.window(turn, segment)
        request = self._new_request()
        self._early = _Early(request, turn, audio)
        return [*actions, AskDetector(request, audio), AwaitVerdict(request, turn)]

    def _paused(self, turn: int, segment: np.ndarray) -> list[DetectorAction]:
        audio = self.window(turn, segment)
        self._turn_audio, self._audio_turn = [audio], turn
        early = self._early
        if early is not None and early.turn == turn and np.array_equal(early.audio, audio):
            self._early = None  # judged at the likely final, on this very audio, and awaited since
            if early.probability is not None:
                return [DeliverVerdict(self._verdict(early.probability))]
            self._judging.add(early.request)
            return []
        actions = self._drop_early()
        request = self._new_request()
        self._judging.add(request)
        return [*actions, AskDetector(request, audio), AwaitVerdict(request, turn)]

    def _drop_early(self) -> list[DetectorAction]:
        if self._early is None:
            return []
        request, self._early = self._early.request, None
        return [DropVerdict(request)]

    def _drop_all(self) -> list[DetectorAction]:
        actions = self._drop_early()
        actions.extend(DropVerdict(request) for request in sorted(self._judging))
        self._judging.clear()
        return actions

    def _new_request(self) -> int:
        self._next_request += 1
        return self._next_request
