"""Turn-taking as an explicit state machine: who holds the floor, and what the session must do about it. No I/O.

The shape is h11's and websockets' `Protocol`: a small `State` enum, one method, `handle(event) -> list[action]`, that
holds every legal transition (the states, events, actions and records are in machine_events.py, the waits in
machine_config.py; every move it makes is a row of the table in transitions.py, which a test holds it to). What it
remembers beyond its state lives in the record of the state it belongs to: the user's turn (`UserTurn`), the answer
in flight (`AnswerState`), and a contested sound while the answer speaks (`Contest`, in BARGE_IN_PENDING only).
The session core (voice/turn/session_core.py) joins it to the listener and the turn detector, and a thin async shell
(`voice.turn.session.Session`) only executes the actions. Tests drive it with lists of events and assert the actions:
no models, no sleeps, no event loop.

Why the machine moves as it does (speculative end of turn, release on the likely final, turn continuation, barge-in
that needs words, the two clocks) is told beside its table of moves, in voice/turn/transitions.py.

At most one answer exists at a time: every `StartAnswer` is preceded by the `CancelAnswer` of the one before.
"""

from __future__ import annotations

from dataclasses import replace

from voice.end_of_turn import Signals
from voice.listen.words import asks_a_question, same_words, trails_off
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.machine_events import (
    PLAYING_STATES,
    AbandonTurn,
    AnswerAudio,
    AnswerFinished,
    AnswerState,
    AssistantAnnounces,
    CancelAnswer,
    ClientInterrupt,
    ClockTick,
    Contest,
    EndSegment,
    FinishTurn,
    LikelyVerdict,
    LmTurnVerdict,
    PauseOutput,
    ReleaseAnswer,
    ResumeOutput,
    Silence,
    StartAnswer,
    State,
    TurnAction,
    TurnEvent,
    TurnVerdict,
    TypedText,
    UserDone,
    UserFinal,
    UserLikelyFinal,
    UserNoWords,
    UserResumed,
    UserSpeechEnded,
    UserSpeechStarted,
    UserTurn,
    UserWords,
)


class TurnTakingError(RuntimeError):
    """An event that cannot happen in the current state (a bug in the shell that feeds the machine)."""


class TurnTaking:
    """The turn-taking core of one session. Feed every event to `handle`; execute the actions it returns, in order."""

    def __init__(self, config: TurnTakingConfig | None = None) -> None:
        self.retune(config or TurnTakingConfig())
        self.state = State.LISTENING
        self.turn_no = 0  # the last turn number handed out
        self._user: UserTurn | None = None  # the user turn being spoken, paused or answered
        self._answer: AnswerState | None = None
        self._answer_ids = 0
        self._contest: Contest | None = None  # BARGE_IN_PENDING's record, in that state only (`_to` keeps it so)

    def retune(self, config: TurnTakingConfig) -> None:
        """Decide by `config` from now on (a client's tuning of its session: voice/turn/tuning.py)."""
        self.config = c = config
        self._end_of_turn = replace(c.end_of_turn, complete_ms=c.complete_silence_ms,
                                    incomplete_ms=c.incomplete_silence_ms, question_ms=c.question_silence_ms,
                                    silence_rule_ms=c.silence_rule_ms)

    @property
    def user_turn(self) -> int:
        """The turn number that the listener's events belong to now (contested speech: the turn it would open)."""
        if self._contest is not None and not self._continues(self._contest.started_ms):
            return self.turn_no + 1
        return self._user.turn if self._user is not None else self.turn_no

    @property
    def released_early(self) -> bool:
        """Whether the answer to the open segment's likely final was released before the segment ended."""
        return self._user is not None and self._user.released_early

    @property
    def answer_id(self) -> int | None:
        return self._answer.answer_id if self._answer is not None else None

    @property
    def words_so_far(self) -> str | None:
        """The words of the user's turn before the segment being spoken ("" in its first), while the user speaks and
        no answer to the turn is in flight: what the turn's next answer will begin its message with. None otherwise."""
        if self.state is not State.USER_SPEAKING or self._answer is not None:
            return None
        return self._user.text if self._user is not None else ""

    def handle(self, event: TurnEvent) -> list[TurnAction]:
        """Apply one event; return what the shell must do, in order. Which states each event moves between, and what
        it asks of the shell there, is `voice.turn.transitions.TRANSITIONS` (checked against this code by a test)."""
        match event:
            case UserSpeechStarted():
                return self._speech_started(event)
            case UserSpeechEnded(at_ms=at_ms):
                return self._speech_ended(at_ms)
            case UserWords():
                return self._confirm_barge_in() if self.state is State.BARGE_IN_PENDING else []
            case UserNoWords(through_ms=through_ms):
                return self._no_words(through_ms)
            case UserLikelyFinal(text=text):
                return self._likely_final(text.strip())
            case UserResumed():
                return self._resumed()
            case UserFinal(text=text):
                return self._final(text.strip())
            case Silence(ms=ms):
                return self._silence(ms)
            case TurnVerdict(complete=complete, probability=probability):
                return self._verdict(complete, probability)
            case LikelyVerdict(probability=probability):
                return self._likely_verdict(probability)
            case LmTurnVerdict(answer_id=answer_id, probability=probability):
                return self._lm_verdict(answer_id, probability)
            case UserDone():
                return self._user_done()
            case ClockTick():
                return self._tick(event)
            case TypedText(text=text, continues=continues):
                return self._typed(text, continues)
            case ClientInterrupt():
                return self._interrupt()
            case AnswerAudio(answer_id=answer_id):
                if self._is_current(answer_id) and self.state is State.ANSWERING:
                    self._to(State.SPEAKING)
                return []
            case AnswerFinished(answer_id=answer_id):
                return self._answer_finished(answer_id)
            case AssistantAnnounces(text=text):
                return self._announce(text)
        raise TurnTakingError(f"unknown event {event!r}")

    def _to(self, state: State) -> None:
        """Move to `state`; BARGE_IN_PENDING's record goes with that state."""
        self.state = state
        if state is not State.BARGE_IN_PENDING:
            self._contest = None

    # --- the user's side -------------------------------------------------------------------------------------------
    def _speech_ended(self, at_ms: float) -> list[TurnAction]:
        if self._user is not None and (self.state is State.USER_SPEAKING or self._user.released_early):
            self._user.last_voiced_ms = at_ms
        return []  # a contested segment's end counts only if it proves to be words (see _confirm_barge_in)

    def _resumed(self) -> list[TurnAction]:
        if self._user is not None:
            self._user.likely_verdict = None  # on audio the voice has since gone on from
        if self.state is State.USER_SPEAKING and self._answer is not None:
            return self._cancel("user_continued", ends_turn=False)  # the answer to the likely final
        if self._user is not None and self._user.released_early:  # ... released: the turn goes on
            return self._resumed_after_release()
        return []

    def _silence(self, ms: float) -> list[TurnAction]:
        if self.state is State.USER_PAUSED and self._user is not None:
            self._user.silence_ms = ms
            self._user.stalled_ms = 0.0
            return self._maybe_confirm()
        if self.state is State.USER_SPEAKING and self._user is not None:
            self._user.silence_ms = ms
            return self._maybe_release_early()
        return []

    def _verdict(self, complete: bool, probability: float | None) -> list[TurnAction]:
        if self.state is State.USER_PAUSED and self._user is not None:
            self._user.verdict, self._user.verdict_probability = complete, probability
            return self._maybe_confirm()
        return []

    def _likely_verdict(self, probability: float | None) -> list[TurnAction]:
        if self.state is State.USER_SPEAKING and self._user is not None:
            self._user.likely_verdict = probability
            return self._maybe_release_early()
        return []

    def _lm_verdict(self, answer_id: int, probability: float) -> list[TurnAction]:
        if not self._is_current(answer_id):
            return []
        assert self._answer is not None
        self._answer.end_of_turn = probability
        if self.state is State.USER_PAUSED:
            return self._maybe_confirm()
        if self.state is State.USER_SPEAKING:
            return self._maybe_release_early()
        return []

    def _speech_started(self, event: UserSpeechStarted) -> list[TurnAction]:
        state = self.state
        if state is State.LISTENING:
            self._open_turn()
            return []
        if state in (State.USER_SPEAKING, State.BARGE_IN_PENDING):
            return []  # the listener reports one start per segment; a repeat changes nothing
        if state is State.USER_PAUSED:  # the user went on: drop the speculation, same turn
            actions = self._cancel("user_continued", ends_turn=False)
            self._to(State.USER_SPEAKING)
            return actions
        if state is State.ANSWERING:  # no audio out yet: the answer is dropped either way, never queued
            if self._continues(event.at_ms):
                actions = self._cancel("user_continued", ends_turn=False)
            else:
                actions = self._cancel("new_turn", ends_turn=True)
                self._open_turn()
            self._to(State.USER_SPEAKING)
            return actions
        # SPEAKING: maybe a barge-in, maybe a cough or the assistant's own echo: pause, and wait for words
        self._to(State.BARGE_IN_PENDING)
        self._contest = Contest(event.at_ms)
        answer = self._answer
        assert answer is not None  # SPEAKING always has an answer
        return [PauseOutput(answer.answer_id, answer.turn)]

    def _confirm_barge_in(self) -> list[TurnAction]:
        assert self._contest is not None
        if self._continues(self._contest.started_ms):
            actions = self._cancel("user_continued", ends_turn=False, clear=True)
        else:
            actions = self._cancel("barge_in", ends_turn=True, clear=True)
            self._open_turn()
        self._to(State.USER_SPEAKING)
        return actions

    def _likely_final(self, text: str) -> list[TurnAction]:
        """Start the held answer on the segment's likely final, before the segment ends."""
        user = self._user
        if self.state is not State.USER_SPEAKING or user is None or not self.config.early_answer or user.done:
            return []
        joined = " ".join(segment for segment in [*user.segments, text] if segment)
        if not joined:
            return []
        actions = self._cancel("transcript_changed", ends_turn=False)  # an earlier likely final of this segment
        user.speculations += 1
        answer = self._new_answer(user.turn, held=True, spoken_turn=True, text=joined)
        return [*actions, StartAnswer(answer.answer_id, user.turn, joined, held=True)]

    def _final(self, text: str) -> list[TurnAction]:
        if self.state is State.BARGE_IN_PENDING:
            if not text:  # no words: a cough or an echo; the answer plays on
                actions = self._resume()
                self._to(State.SPEAKING)
                return actions
            actions = self._confirm_barge_in()
            return actions + self._final(text)
        if self._user is not None and self._user.released_early:  # the answered segment's end: the record only
            self._user.released_early = False
            if text:
                self._user.segments.append(text)
            return []
        if self.state is not State.USER_SPEAKING or self._user is None:
            return []  # a segment abandoned by a typed turn or an interrupt
        user = self._user
        if text:
            user.segments.append(text)
        if not user.text:  # noise that looked like speech: no words, no turn
            actions = self._cancel("no_words", ends_turn=False)
            self._user = None
            self._to(State.LISTENING)
            return actions
        user.silence_ms = user.stalled_ms = 0.0
        user.verdict = user.verdict_probability = None
        confirmed = user.done
        started = self._answer
        if started is not None and same_words(started.text, user.text):  # the answer to the likely final's words
            self._to(State.USER_PAUSED)
            return self._confirm() if confirmed else []
        actions = self._cancel("transcript_changed", ends_turn=False)
        if not confirmed and not self.config.early_answer:
            self._to(State.USER_PAUSED)  # nothing starts until the end of turn is confirmed
            return actions
        user.speculations += 1
        answer = self._new_answer(user.turn, held=not confirmed, spoken_turn=True, text=user.text)
        self._to(State.ANSWERING if confirmed else State.USER_PAUSED)
        return [*actions, StartAnswer(answer.answer_id, user.turn, user.text, held=answer.held)]

    def _maybe_confirm(self) -> list[TurnAction]:
        """The end-of-turn rule: the pause ends the turn once its silence reaches what the verdict asks for."""
        user = self._user
        if user is None or self.config.explicit_end:
            return []
        needed = self._end_of_turn.wait_ms(self._signals(user))
        return self._confirm() if user.silence_ms + user.stalled_ms >= needed else []

    def _maybe_release_early(self) -> list[TurnAction]:
        """Release the likely final's held answer before the segment ends: both signals on its words are in, the rule
        calls the turn complete, and the silence has reached the rule's wait for that (module docstring)."""
        user, answer = self._user, self._answer
        config = self.config
        if (self.state is not State.USER_SPEAKING or user is None or answer is None or not answer.held or user.done
                or config.explicit_end or not config.release_on_likely_final
                or user.likely_verdict is None or answer.end_of_turn is None):
            return []
        signals = Signals(user.likely_verdict, answer.end_of_turn, asks_a_question(answer.text),
                          trails_off(answer.text))
        if not self._end_of_turn.complete(signals) or user.silence_ms < self._end_of_turn.wait_ms(signals):
            return []
        user.released_early = True
        return self._confirm()

    def _resumed_after_release(self) -> list[TurnAction]:
        """The voice came back inside the segment whose likely final's answer was released: the turn goes on, and
        the answer (its audio cleared, if any went out) is dropped."""
        user = self._user
        assert user is not None
        user.released_early = False
        if self._answer is None:
            return []
        actions = self._cancel("user_continued", ends_turn=False, clear=self.state in PLAYING_STATES)
        self._to(State.USER_SPEAKING)
        return actions

    def _signals(self, user: UserTurn) -> Signals:
        """What the end-of-turn rule judges the paused turn by: the detector's verdict (a bare one as a sure one),
        the LM's probability when the answer it came from answers these very words, and the two word rules."""
        audio = None
        if user.verdict is not None:
            audio = user.verdict_probability if user.verdict_probability is not None else float(user.verdict)
        answer = self._answer
        text = answer.end_of_turn if answer is not None and same_words(answer.text, user.text) else None
        return Signals(audio, text, asks_a_question(user.text), trails_off(user.text))

    def _user_done(self) -> list[TurnAction]:
        if self._user is None:
            return []
        self._user.done = True
        return self._confirm() if self.state is State.USER_PAUSED else []

    def _confirm(self) -> list[TurnAction]:
        """The end of the paused turn is sure: release the held answer, or start it if nothing was speculated."""
        user = self._user
        if user is None:
            return []
        self._to(State.ANSWERING)
        if self._answer is not None:
            self._answer.held = False
            return [ReleaseAnswer(self._answer.answer_id)]
        user.speculations += 1
        answer = self._new_answer(user.turn, held=False, spoken_turn=True, text=user.text)
        return [StartAnswer(answer.answer_id, user.turn, user.text, held=False)]

    # --- the shell's clock -----------------------------------------------------------------------------------------
    def _tick(self, tick: ClockTick) -> list[TurnAction]:
        stalled = tick.audio_gap_ms >= self.config.stalled_audio_ms
        if not stalled and self._user is not None:
            self._user.segment_end_asked = False
        if self._contest is not None:
            return self._contest_tick(self._contest, tick.now_ms)
        if not stalled or self.config.explicit_end or self._user is None:
            return []  # explicit end: the caller ends each turn itself, however long its audio pauses
        if self.state is State.USER_SPEAKING and not self._user.segment_end_asked:
            self._user.segment_end_asked = True
            return [EndSegment()]
        if self.state is State.USER_PAUSED:
            self._user.stalled_ms = tick.audio_gap_ms
            return self._maybe_confirm()
        return []

    def _no_words(self, through_ms: float) -> list[TurnAction]:
        """A sound paused the answer: play on once `resume_after_ms` of it was decoded without a word (words that come
        later still barge in). Judged on what the recogniser heard, not on the wall clock: a busy CPU delays the
        decode, and resuming before it speaks over a user whose words are still being read."""
        contest = self._contest
        if contest is None or through_ms - contest.started_ms < self.config.resume_after_ms:
            return []
        return self._resume()  # once: it only resumes a paused answer

    def _contest_tick(self, contest: Contest, now_ms: float) -> list[TurnAction]:
        """... or once `resume_limit_ms` passed since the pause, however far the recogniser got (a long noise never
        holds the answer back)."""
        if not contest.paused:
            return []
        if contest.paused_since_ms is None:
            contest.paused_since_ms = now_ms
        elif now_ms - contest.paused_since_ms >= self.config.resume_limit_ms:
            return self._resume()
        return []

    def _resume(self) -> list[TurnAction]:
        contest = self._contest
        if contest is None or not contest.paused or self._answer is None:
            return []
        contest.paused, contest.paused_since_ms = False, None
        return [ResumeOutput(self._answer.answer_id, self._answer.turn)]

    # --- the client ------------------------------------------------------------------------------------------------
    def _typed(self, text: str, continues: bool = False) -> list[TurnAction]:
        actions = self._stop_everything("new_text")
        self.turn_no += 1
        self._user = None
        answer = self._new_answer(self.turn_no, held=False, spoken_turn=False)
        self._to(State.ANSWERING)
        actions.append(StartAnswer(answer.answer_id, self.turn_no, text, held=False, continues=continues))
        return actions

    def _announce(self, text: str) -> list[TurnAction]:
        """An announcement takes a turn of its own, like a typed one, but only from a free floor; the user's speech
        barges in on it as on any answer."""
        if self.state is not State.LISTENING or self._answer is not None:
            return []
        self.turn_no += 1
        answer = self._new_answer(self.turn_no, held=False, spoken_turn=False)
        self._to(State.ANSWERING)
        return [StartAnswer(answer.answer_id, self.turn_no, text, held=False, announcement=True)]

    def _interrupt(self) -> list[TurnAction]:
        user_was_speaking = self.state in (State.USER_SPEAKING, State.BARGE_IN_PENDING)
        actions = self._stop_everything("interrupt")
        self._user = None
        self._to(State.LISTENING)
        if user_was_speaking:  # the user is still talking: that speech is a turn of its own
            self._open_turn()
        return actions

    def _stop_everything(self, reason: str) -> list[TurnAction]:
        """End the answer in progress and any open user turn (a typed message or an interrupt takes the floor)."""
        if self._answer is not None:
            return self._cancel(reason, ends_turn=True, clear=self.state in (State.SPEAKING, State.BARGE_IN_PENDING))
        if self._user is not None and self._user.text:
            return [AbandonTurn(self._user.turn, self._user.text)]
        return []

    # --- the assistant's side --------------------------------------------------------------------------------------
    def _answer_finished(self, answer_id: int) -> list[TurnAction]:
        if not self._is_current(answer_id):
            return []  # an answer already cancelled: its end changes nothing
        answer = self._answer
        assert answer is not None
        self._answer = None
        user = self._user
        speculations, dropped = (user.speculations, user.dropped) if user is not None else (0, 0)
        actions: list[TurnAction] = [FinishTurn(answer_id, answer.turn, speculations, dropped)]
        self._user = None
        if self.state is State.BARGE_IN_PENDING:  # the answer ended while the user spoke: that speech is a new turn
            self._open_turn()
            self._to(State.USER_SPEAKING)
        else:
            self._to(State.LISTENING)
        return actions

    # --- helpers ---------------------------------------------------------------------------------------------------
    def _open_turn(self) -> None:
        self.turn_no += 1
        self._user = UserTurn(self.turn_no)
        self._to(State.USER_SPEAKING)

    def _new_answer(self, turn: int, held: bool, spoken_turn: bool, text: str = "") -> AnswerState:
        self._answer_ids += 1
        self._answer = AnswerState(self._answer_ids, turn, held, spoken_turn, text)
        return self._answer

    def _continues(self, start_ms: float) -> bool:
        """Speech starting at `start_ms` continues the user's turn: it follows their last word closely."""
        answer, user = self._answer, self._user
        if answer is None or not answer.spoken_turn or user is None or user.last_voiced_ms is None:
            return False
        return start_ms - user.last_voiced_ms <= self.config.continuation_ms

    def _cancel(self, reason: str, ends_turn: bool, clear: bool = False) -> list[TurnAction]:
        answer = self._answer
        if answer is None:
            return []
        self._answer = None
        user = self._user
        continues_as = None
        if not ends_turn and user is not None:
            user.dropped += 1
            if clear:
                self.turn_no += 1
                user.turn = continues_as = self.turn_no
        speculations, dropped = (user.speculations, user.dropped) if user is not None else (0, 0)
        if ends_turn:
            self._user = None
        return [CancelAnswer(answer.answer_id, answer.turn, reason, clear, ends_turn, speculations, dropped,
                             continues_as)]

    def _is_current(self, answer_id: int) -> bool:
        return self._answer is not None and self._answer.answer_id == answer_id
