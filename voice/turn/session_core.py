"""Everything a session decides, without I/O: the turn-taking machine, the turn detector's schedule beside it, and the
rules that join them to what the listener reports. The session shell (voice/turn/session.py) feeds `handle` one event
for each thing that happened and executes the actions it returns, in order; the shell decides nothing itself.

The machine (voice/turn/machine.py) says who holds the floor; the schedule (voice/turn/detector_schedule.py) says on
which audio Smart Turn judges a pause and whether an early verdict still applies. This core adds:

- *When the detector is asked*: as the listener starts the likely final decode (the early verdict), and whenever a
  segment's end leaves the machine holding the turn paused. Speech starting makes every verdict of the pause moot:
  they are dropped before the machine hears the speech. A verdict that still applies becomes the machine's
  `TurnVerdict` here, so the shell only runs the detector and reports what it answered.
- *How a turn is timed* (`MarkTurn`): a spoken turn by its last segment, voice-to-voice from its last voiced sample,
  and its transcript mark is the transcript its answer started from (the likely final when the segment's end kept that
  answer, else the final); a typed turn from the text's arrival.
- *Half duplex*: while the answer's audio plays (its sound contested or not) the microphone is not heard, so the
  assistant cannot interrupt itself through open speakers (`accepts_audio`).
- *Idle*: nobody holds the floor and no answer runs (`idle`; file mode and tests wait for it).

Two rules live in the machine, with the state they read: `CancelAnswer.clear` only for an answer whose audio went out
(`AnswerAudio` moved the machine to SPEAKING), and `Silence` counts only in a pause, so the shell reports the
silence after every chunk of audio and never asks the state first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from voice.turn.detector_schedule import (
    AskDetector,
    AwaitVerdict,
    DeliverVerdict,
    DetectorAnswered,
    DetectorEvent,
    DetectorSchedule,
    DropVerdict,
    LikelyFinalHeard,
    ScheduleClosed,
    TurnPaused,
    UserSpoke,
)
from voice.turn.machine import TurnTaking, TurnTakingError
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.machine_events import (
    PLAYING_STATES,
    AnswerAudio,
    AnswerFinished,
    AssistantAnnounces,
    ClientInterrupt,
    ClockTick,
    LikelyVerdict,
    LmTurnVerdict,
    Silence,
    StartAnswer,
    State,
    TurnAction,
    TypedText,
    UserDone,
    UserFinal,
    UserLikelyFinal,
    UserNoWords,
    UserResumed,
    UserSpeechEnded,
    UserSpeechStarted,
    UserWords,
)


# --- events (into the core; the machine's own UserSpeechStarted, UserResumed, UserNoWords, Silence, UserDone,
# ClockTick, ClientInterrupt, AnswerAudio, AnswerFinished, LmTurnVerdict and AssistantAnnounces pass through to it) ---
@dataclass(frozen=True, slots=True)
class PartialTranscript:
    """A transcript of the open segment, made at `t_ns`. `likely_final`: decoded whole after a moment of silence, the
    segment's words if the user stays silent."""

    text: str
    likely_final: bool
    t_ns: int


@dataclass(frozen=True, slots=True)
class FinalTranscript:
    """The final transcript of the segment that ended, made at `t_ns`; `segment` is that segment's audio (what the
    detector judges if the turn pauses there)."""

    text: str
    t_ns: int
    segment: np.ndarray = field(compare=False)


@dataclass(frozen=True, slots=True)
class LikelyFinalDecoding:
    """The listener starts the open segment's likely final decode; `segment` is its audio if the user stays silent,
    `speech_end_ns` when its last voiced sample arrived."""

    segment: np.ndarray = field(compare=False)
    speech_end_ns: int | None = None


@dataclass(frozen=True, slots=True)
class TextTyped:
    """A typed user turn arrived at `t_ns`; `continues`: no words, the client asks for the answer to the tool
    results it returned (voice/tools/loop.py `HandOut`)."""

    text: str
    t_ns: int
    continues: bool = False


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """The session closes: every detector request still out is dropped."""


SessionEvent = (UserSpeechStarted | UserSpeechEnded | UserResumed | UserNoWords | PartialTranscript | FinalTranscript
                | LikelyFinalDecoding | DetectorAnswered | TextTyped | SessionClosed | Silence | UserDone | ClockTick
                | ClientInterrupt | AnswerAudio | AnswerFinished | LmTurnVerdict | AssistantAnnounces)


# --- actions (out of the core: the machine's, the detector schedule's but DeliverVerdict, and MarkTurn) --------------
@dataclass(frozen=True, slots=True)
class MarkTurn:
    """Record when `turn`'s user side happened, for its latencies (voice/latency.py): `marks` by name (`speech_end`,
    `asr_final`, `text_in`), and `endpoint_detected_ns`, when the endpointer decided its last segment had ended."""

    turn: int
    marks: dict[str, int]
    endpoint_detected_ns: int | None = None


SessionAction = TurnAction | AskDetector | AwaitVerdict | DropVerdict | MarkTurn


def _starts_answer(actions: list[SessionAction]) -> bool:
    return any(isinstance(action, StartAnswer) for action in actions)


class SessionCore:
    """One session's decisions: feed every event to `handle`; execute the actions it returns, in order."""

    def __init__(self, config: TurnTakingConfig | None = None, detector: DetectorSchedule | None = None,
                 full_duplex: bool = True) -> None:
        self.full_duplex = full_duplex
        self.machine = TurnTaking(self._duplex(config or TurnTakingConfig()))
        self._detector = detector  # None: no turn detector, the silence rule alone ends a pause
        self._segment_end: tuple[int, int] | None = None  # (last voiced sample, decided) of the latest segment
        self._likely_final_ns: int | None = None  # when the likely final the current answer started from came
        self._likely_speech_end_ns: int | None = None  # when the last voiced sample of that likely final's audio came

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def user_turn(self) -> int:
        """The turn the listener's events belong to now (they go out tagged with it)."""
        return self.machine.user_turn

    @property
    def turn_no(self) -> int:
        """The last turn number handed out."""
        return self.machine.turn_no

    @property
    def words_so_far(self) -> str | None:
        """The user's words of the turn being spoken, when no answer to it is in flight (`TurnTaking.words_so_far`)."""
        return self.machine.words_so_far

    def retune(self, config: TurnTakingConfig) -> None:
        """End turns by `config` from now on (a client's tuning of its session)."""
        self.machine.retune(self._duplex(config))

    def _duplex(self, config: TurnTakingConfig) -> TurnTakingConfig:
        """In half duplex the microphone goes deaf while the answer plays: the segment's end must come first."""
        return config if self.full_duplex else replace(config, release_on_likely_final=False)

    @property
    def accepts_audio(self) -> bool:
        """Whether microphone audio is heard now: always in full duplex; in half duplex not while the answer plays."""
        return self.full_duplex or self.machine.state not in PLAYING_STATES

    @property
    def idle(self) -> bool:
        """Nobody holds the floor and no answer runs."""
        return self.machine.state is State.LISTENING and self.machine.answer_id is None

    def handle(self, event: SessionEvent) -> list[SessionAction]:
        """Apply one event; return what the shell must do, in order."""
        released = self.machine.released_early
        actions = self._handle(event)
        if not released and self.machine.released_early:  # the answer goes out before its segment's end
            actions = [*self._likely_final_marks(), *actions]
        return actions

    def _likely_final_marks(self) -> list[SessionAction]:
        """The turn's timing when its answer is released on the likely final: its audio may even have played out
        before the segment's end (whose `MarkTurn` then adds the endpoint's moment)."""
        if self._likely_speech_end_ns is None or self._likely_final_ns is None:
            return []
        marks = {"speech_end": self._likely_speech_end_ns, "asr_final": self._likely_final_ns}
        return [MarkTurn(self.machine.user_turn, marks)]

    def _handle(self, event: SessionEvent) -> list[SessionAction]:
        machine = self.machine
        match event:
            case UserSpeechStarted():
                return [*self._schedule(UserSpoke()), *machine.handle(event)]  # that pause's verdicts are moot
            case UserSpeechEnded(t_ns=t_ns, detected_ns=detected_ns):
                self._segment_end = (t_ns, detected_ns)
                return list(machine.handle(event))
            case UserResumed():
                self._likely_final_ns = None
                return list(machine.handle(event))
            case PartialTranscript():
                return self._partial(event)
            case FinalTranscript():
                return self._final(event)
            case LikelyFinalDecoding(segment=segment, speech_end_ns=speech_end_ns):
                self._likely_speech_end_ns = speech_end_ns
                forget = machine.handle(LikelyVerdict(None))  # the last likely final's verdict judged other audio
                return [*forget, *self._schedule(LikelyFinalHeard(machine.user_turn, segment))]
            case DetectorAnswered():
                return self._schedule(event)
            case SessionClosed():
                return self._schedule(ScheduleClosed())
            case TextTyped(text=text, t_ns=t_ns, continues=continues):
                actions = machine.handle(TypedText(text, continues))
                return [MarkTurn(machine.turn_no, {"text_in": t_ns}), *actions]
            case (UserNoWords() | Silence() | UserDone() | ClockTick() | ClientInterrupt() | AnswerAudio()
                  | AnswerFinished() | LmTurnVerdict() | AssistantAnnounces()):
                return list(machine.handle(event))
        raise TurnTakingError(f"not a session event: {event!r}")

    def _partial(self, event: PartialTranscript) -> list[SessionAction]:
        actions: list[SessionAction] = list(self.machine.handle(UserWords())) if event.text.strip() else []
        if event.likely_final:
            started = self.machine.handle(UserLikelyFinal(event.text))
            if _starts_answer(started):
                self._likely_final_ns = event.t_ns  # the transcript this answer started from
            actions.extend(started)
        return actions

    def _final(self, event: FinalTranscript) -> list[SessionAction]:
        machine = self.machine
        released = machine.released_early  # the segment whose likely final's answer already went out
        actions: list[SessionAction] = list(machine.handle(UserFinal(event.text)))
        kept = None if _starts_answer(actions) else self._likely_final_ns  # else the final replaced that answer
        self._likely_final_ns = None
        segment_end, self._segment_end = self._segment_end, None
        turn = machine.user_turn
        if (released or machine.state in (State.USER_PAUSED, State.ANSWERING)) and segment_end is not None:
            # the turn's timing is its last segment's: voice-to-voice counts from the last word said; its transcript
            # is the one its answer started from (the likely final, when the answer kept it)
            speech_end, detected = segment_end
            marks = {"speech_end": speech_end, "asr_final": kept if kept is not None else event.t_ns}
            actions.insert(0, MarkTurn(turn, marks, detected))
        if released or machine.state is State.USER_PAUSED:  # the pause needs a verdict (no detector: the silence
            # rule alone); after a release the detector only keeps the segment's audio as the turn's
            actions.extend(self._schedule(TurnPaused(turn, event.segment)))
        return actions

    def _schedule(self, event: DetectorEvent) -> list[SessionAction]:
        """The detector schedule's actions for `event`; a verdict that still applies goes to the machine here."""
        if self._detector is None:
            return []
        actions: list[SessionAction] = []
        for action in self._detector.handle(event):
            if isinstance(action, DeliverVerdict) and action.likely_final:
                actions.extend(self.machine.handle(LikelyVerdict(action.verdict.probability)))
            elif isinstance(action, DeliverVerdict):
                actions.extend(self.machine.handle(action.verdict))
            else:
                actions.append(action)
        return actions
