"""Turn-taking as an explicit state machine: who holds the floor, and what the session must do about it. No I/O.

The shape is h11's and websockets' `Protocol`: a small `State` enum, one method, `handle(event) -> list[action]`, that
holds every legal transition. The session core (voice/turn/session_core.py) joins it to the listener and the turn
detector, and a thin async shell (`voice.turn.session.Session`) only executes the actions. Tests drive it with lists
of events and assert the actions: no models, no sleeps, no event loop.

Speculative end of turn. The listener decodes a segment as soon as its speech has been followed by a moment of
silence (~64 ms: the likely final, `UserLikelyFinal`), and the answer starts right there (`StartAnswer(held=True)`),
while the segment is still open: the LM and the first phrase's TTS run while the end of turn is undecided. A voice that
comes back inside the segment (`UserResumed`) drops that answer. The segment's end (`UserFinal`, after ~320 ms of
silence) keeps the answer when its transcript is the one the answer started from, or replaces it (state
`USER_PAUSED`). The end of turn is confirmed by more silence (`Silence`: the silence rule, or
Smart Turn's verdict shortening or lengthening it), or by the caller saying the user is done (`UserDone`: a file's
end, push-to-talk); then the held audio is released at once (`ReleaseAnswer`). If the user speaks again first, the held
answer is dropped and counted (`CancelAnswer(ends_turn=False)`), and the next segment continues the same turn.

Released on the likely final. When both signals on the likely final's words are in (the detector's verdict on the very
audio the segment will end with, and the LM's from the answer's first pass) and the rule calls the turn complete, the
held answer is released once the silence reaches the rule's short wait (`complete_silence_ms`, 200 ms), without
waiting for the segment's end (320 ms of silence, the endpointer's): its audio, often ready before then, goes out
sooner. The segment's final comes later and only completes the turn's record. A voice that comes back inside the
segment after that (`UserResumed`) is the turn going on: the answer is cancelled and its audio cleared, as for speech
that resumes within `continuation_ms` of an answer that already spoke (`release_on_likely_final=False`: released at
the segment's end only, as half duplex must: it stops hearing the microphone once the answer plays).

Turn continuation. Speech that resumes within `continuation_ms` of the user's last voiced sample, before or while the
answer starts, continues the same user turn: the answer is cancelled (and the output cleared) without ending the turn,
the segments' transcripts are joined, and the turn gets one answer. Later speech starts a new turn, and an answer that
has not finished is cancelled then, never queued behind the new turn.

A transcript that trails off ("My brother and I...", "should I take the") waits as long as an unfinished verdict,
whatever the detector heard (`voice.listen.words.trails_off`). The LM's own probability that the message ended
there (`LmTurnVerdict`, from the answer's first pass) joins the detector's in one fitted rule (voice/end_of_turn.py).

Barge-in needs real speech. Sound heard while the assistant is speaking pauses its audio (`PauseOutput`, state
`BARGE_IN_PENDING`) and interrupts only once a word is recognised. A cough or an echo is not words: the audio resumes
(`ResumeOutput`) when its transcript comes back empty, or `resume_after_ms` after the pause if no word has come by then
(a long noise never holds the answer back); words recognised later still barge in. The answer is never dropped for a
sound.

Time. The end of turn is measured on the audio stream's own clock (`Silence`), so a slow step never stretches a pause.
But a client can stop sending audio (a muted tab, a network stall, a file client done with its clip): the shell's clock
then takes over (`ClockTick`, wall time, fed by the shell about every 100 ms, with how long it has waited for audio).
Once no audio has come for `stalled_audio_ms`, an open speech segment is ended with what was heard (`EndSegment`), and
a pause's silence goes on growing with the wall clock, so the turn ends as it would have on silent audio. The core
reads no clock itself.

At most one answer exists at a time: every `StartAnswer` is preceded by the `CancelAnswer` of the one before.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from voice.end_of_turn import EndOfTurnRule, Signals
from voice.listen.words import asks_a_question, same_words, trails_off


class State(enum.Enum):
    LISTENING = "listening"  # nobody holds the floor
    USER_SPEAKING = "user_speaking"  # a user turn is open and its current segment is being spoken
    USER_PAUSED = "user_paused"  # the segment ended; the answer is being prepared, held until the end of turn is sure
    ANSWERING = "answering"  # end of turn confirmed (or typed): the answer runs, its audio goes out as it comes
    SPEAKING = "speaking"  # the answer's audio has started
    # speaking, and user sound was heard: the audio is paused until the sound proves to be words (barge-in) or not
    BARGE_IN_PENDING = "barge_in_pending"


# The states in which the answer's audio is playing (or paused for a sound that may prove to be words)
PLAYING_STATES = (State.SPEAKING, State.BARGE_IN_PENDING)


# --- events (into the machine) ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UserSpeechStarted:
    """The endpointer heard speech begin; `at_ms` is its first voiced sample's place on the audio stream's own clock
    (milliseconds of audio since the stream began), so a slow decode that delays processing never stretches a pause."""

    at_ms: float


@dataclass(frozen=True, slots=True)
class UserSpeechEnded:
    """The current speech segment ended; `at_ms`: its last voiced sample on the stream's clock. The session core
    also reads when that sample arrived (`t_ns`) and when the endpointer decided the segment had ended
    (`detected_ns`), for the turn's timing marks; the machine needs neither."""

    at_ms: float
    t_ns: int = 0
    detected_ns: int = 0


@dataclass(frozen=True, slots=True)
class UserWords:
    """A partial transcript of the current segment holds words (not just noise)."""


@dataclass(frozen=True, slots=True)
class UserLikelyFinal:
    """The current segment's transcript if the user stays silent: its speech was followed by a moment of silence and
    decoded whole; the segment is still open (its end and `UserFinal` follow unless the voice comes back)."""

    text: str


@dataclass(frozen=True, slots=True)
class UserResumed:
    """The user's voice came back inside the current segment after its likely final (a short pause)."""


@dataclass(frozen=True, slots=True)
class UserFinal:
    """The final transcript of one speech segment (empty when Whisper heard no words)."""

    text: str


@dataclass(frozen=True, slots=True)
class Silence:
    """The user has been silent for `ms` since the last voiced sample (measured on the audio clock). The shell reports
    it after every chunk of audio; it counts only in a pause."""

    ms: float


@dataclass(frozen=True, slots=True)
class LikelyVerdict:
    """The turn detector's probability that the turn is complete, judged on the audio the open segment will end with
    if the user stays silent (asked as its likely final is decoded); None: a new likely final is being judged, forget
    the last one."""

    probability: float | None


@dataclass(frozen=True, slots=True)
class TurnVerdict:
    """A turn detector's opinion of the paused turn: complete or not (Smart Turn), and its probability when it gives
    one (the end-of-turn rule combines it with the LM's, `LmTurnVerdict`)."""

    complete: bool
    probability: float | None = None


@dataclass(frozen=True, slots=True)
class LmTurnVerdict:
    """The LM's opinion of the words answer `answer_id` started from: its probability that the message ends right
    after the user's last word (the end-of-message token or a sentence end), read from that answer's first pass
    (model/decoding/end_of_turn.py)."""

    answer_id: int
    probability: float


@dataclass(frozen=True, slots=True)
class UserDone:
    """The caller knows the user's turn ends with the current speech (end of a file, end of the stream)."""


@dataclass(frozen=True, slots=True)
class ClockTick:
    """The shell's clock: `now_ms` of wall time (any monotonic origin), and `audio_gap_ms`, how long the shell has been
    waiting for audio with none arriving (0 while a chunk is being processed: a slow step is not a silent client)."""

    now_ms: float
    audio_gap_ms: float


@dataclass(frozen=True, slots=True)
class TypedText:
    text: str
    continues: bool = False  # no words: answer the tool results a client returned


@dataclass(frozen=True, slots=True)
class AssistantAnnounces:
    """The assistant has something to say unprompted (a timer that is due). It is said only when nobody holds the
    floor; otherwise the machine returns nothing and the shell asks again once the session is idle, so an
    announcement never talks over the user or another answer."""

    text: str


@dataclass(frozen=True, slots=True)
class ClientInterrupt:
    """The client asked the assistant to stop talking."""


@dataclass(frozen=True, slots=True)
class AnswerAudio:
    """The first audio of answer `answer_id` went out."""

    answer_id: int


@dataclass(frozen=True, slots=True)
class AnswerFinished:
    """Answer `answer_id` ended on its own (done, failed or timed out) and its audio has played."""

    answer_id: int


TurnEvent = (UserSpeechStarted | UserSpeechEnded | UserWords | UserLikelyFinal | UserResumed | UserFinal | Silence
             | LikelyVerdict | TurnVerdict | LmTurnVerdict | UserDone | ClockTick | TypedText | ClientInterrupt
             | AnswerAudio | AnswerFinished | AssistantAnnounces)


# --- actions (out of the machine) ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StartAnswer:
    """Start answering `text` for `turn`. `held`: keep its audio (and its other events) until `ReleaseAnswer`.
    `announcement`: `text` is the assistant's own words to say (`AssistantAnnounces`), not the user's to answer."""

    answer_id: int
    turn: int
    text: str
    held: bool
    announcement: bool = False
    continues: bool = False  # no user words: answer the tool results a client returned (in the history already)


@dataclass(frozen=True, slots=True)
class ReleaseAnswer:
    """The end of turn is confirmed: hand out the held answer's events and audio now."""

    answer_id: int


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    """Stop answer `answer_id`. `clear`: its audio went out (`AnswerAudio` came), tell the output to stop playing it;
    never for an answer not heard. `ends_turn`: the turn ends here (TurnEnd, interrupted; the history keeps what was
    heard); otherwise the user continues the same turn and the answer vanishes without a trace (a dropped
    speculation)."""

    answer_id: int
    turn: int
    reason: str
    clear: bool
    ends_turn: bool
    speculations: int = 0
    dropped: int = 0
    # A continued turn whose answer was already heard (and cleared) goes on under a new number: outputs refuse a
    # cleared turn's later audio, and the merged answer must be heard.
    continues_as: int | None = None


@dataclass(frozen=True, slots=True)
class FinishTurn:
    """Answer `answer_id` completed: the turn ends normally."""

    answer_id: int
    turn: int
    speculations: int
    dropped: int


@dataclass(frozen=True, slots=True)
class AbandonTurn:
    """A user turn with words ends unanswered (a typed message took the floor before it was answered)."""

    turn: int
    text: str


@dataclass(frozen=True, slots=True)
class PauseOutput:
    """Sound while answer `answer_id` speaks: stop playing its audio, keep the rest (it may resume)."""

    answer_id: int
    turn: int


@dataclass(frozen=True, slots=True)
class ResumeOutput:
    """The sound was not words: play answer `answer_id` on from where it paused."""

    answer_id: int
    turn: int


@dataclass(frozen=True, slots=True)
class EndSegment:
    """The client stopped sending audio mid-speech: end the open speech segment with what was heard (its end and
    final transcript follow as usual)."""


TurnAction = (StartAnswer | ReleaseAnswer | CancelAnswer | FinishTurn | AbandonTurn | PauseOutput | ResumeOutput
              | EndSegment)


class TurnTakingError(RuntimeError):
    """An event that cannot happen in the current state (a bug in the shell that feeds the machine)."""


@dataclass(frozen=True, slots=True)
class TurnTakingConfig:
    """Timings in milliseconds. `explicit_end`: only `UserDone` confirms an end of turn (file mode: one file, one
    turn, whatever pauses it holds). `early_answer=False` starts the answer only once the end of turn is confirmed."""

    silence_rule_ms: float = 600.0  # no verdict (no turn detector): confirm after this much silence
    complete_silence_ms: float = 200.0  # the detector says complete
    # the detector says incomplete: wait this long before ending it anyway. Smart Turn hears 26 % of finished
    # utterances as unfinished (scripts/bench/bench_turn_detector.py), and each then waited this long: 1.5 s keeps
    # a thinking pause inside the turn and a misjudged question under 2 s (2 s put the load test's p95 at 2,000 ms)
    incomplete_silence_ms: float = 1500.0
    # ... unless Whisper wrote the words as a finished question (`asks_a_question`): a pause after a question mark
    # is rarely a thinking pause, and the misjudged questions were most of the holds in the latency report
    question_silence_ms: float = 800.0
    continuation_ms: float = 1200.0  # speech resuming this soon after the last voiced sample continues the turn
    # Wall clock: no audio for this long means the client stopped sending (a frame every 20-100 ms is normal)
    stalled_audio_ms: float = 1000.0
    resume_after_ms: float = 600.0  # a sound paused the answer: play on after this long if no word came
    explicit_end: bool = False
    early_answer: bool = True
    # release the likely final's answer before the segment ends when the rule calls it complete (module docstring)
    release_on_likely_final: bool = True
    # How the detector's and the LM's probabilities combine (fitted: voice/end_of_turn.py); its waits are the ones above
    end_of_turn: EndOfTurnRule = field(default_factory=EndOfTurnRule)

    def __post_init__(self) -> None:
        durations = {
            "silence_rule_ms": self.silence_rule_ms, "complete_silence_ms": self.complete_silence_ms,
            "incomplete_silence_ms": self.incomplete_silence_ms, "question_silence_ms": self.question_silence_ms,
            "continuation_ms": self.continuation_ms, "stalled_audio_ms": self.stalled_audio_ms,
            "resume_after_ms": self.resume_after_ms,
        }
        for name, value in durations.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0")


@dataclass(slots=True)
class _AnswerState:
    answer_id: int
    turn: int
    held: bool
    spoken_turn: bool  # answers a spoken turn (continuation applies), not a typed one
    text: str = ""  # the user's words it answers
    end_of_turn: float | None = None  # the LM's P(end of message) after those words (`LmTurnVerdict`)


@dataclass(slots=True)
class _UserTurn:
    turn: int
    segments: list[str] = field(default_factory=list)
    last_voiced_ms: float | None = None  # end of the latest segment, on the stream's clock
    speculations: int = 0
    dropped: int = 0
    done: bool = False  # UserDone arrived: the next segment end confirms at once
    verdict: bool | None = None
    verdict_probability: float | None = None  # the detector's probability behind `verdict`, when it gave one
    silence_ms: float = 0.0  # on the audio clock, up to the last chunk that arrived
    likely_verdict: float | None = None  # the detector's probability on the likely final's audio (`LikelyVerdict`)
    released_early: bool = False  # its answer was released on the likely final: the open segment is the answered one
    stalled_ms: float = 0.0  # wall time since then, once the audio has stalled (0 while it flows)

    @property
    def text(self) -> str:
        return " ".join(segment for segment in self.segments if segment)


class TurnTaking:
    """The turn-taking core of one session. Feed every event to `handle`; execute the actions it returns, in order."""

    def __init__(self, config: TurnTakingConfig | None = None) -> None:
        self.retune(config or TurnTakingConfig())
        self.state = State.LISTENING
        self.turn_no = 0  # the last turn number handed out
        self._user: _UserTurn | None = None  # the user turn being spoken, paused or answered
        self._answer: _AnswerState | None = None
        self._answer_ids = 0
        self._pending_start_ms = 0.0  # BARGE_IN_PENDING: when the contested speech began
        self._output_paused = False  # BARGE_IN_PENDING: the answer's audio is paused
        self._paused_since_ms: float | None = None  # on the shell's clock: the first tick after the pause
        self._segment_end_asked = False  # EndSegment went out for the current stall

    def retune(self, config: TurnTakingConfig) -> None:
        """Decide by `config` from now on (a client's tuning of its session: voice/turn/tuning.py)."""
        self.config = c = config
        self._end_of_turn = replace(c.end_of_turn, complete_ms=c.complete_silence_ms,
                                    incomplete_ms=c.incomplete_silence_ms, question_ms=c.question_silence_ms,
                                    silence_rule_ms=c.silence_rule_ms)

    @property
    def user_turn(self) -> int:
        """The turn number that the listener's events belong to now (contested speech: the turn it would open)."""
        if self.state is State.BARGE_IN_PENDING and not self._continues(self._pending_start_ms):
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
        """Apply one event; return what the shell must do, in order."""
        match event:
            case UserSpeechStarted():
                return self._speech_started(event)
            case UserSpeechEnded(at_ms=at_ms):
                if self._user is not None and (self.state is State.USER_SPEAKING or self._user.released_early):
                    self._user.last_voiced_ms = at_ms
                return []  # a contested segment's end counts only if it proves to be words (see _confirm_barge_in)
            case UserWords():
                if self.state is State.BARGE_IN_PENDING:
                    return self._confirm_barge_in()
                return []
            case UserLikelyFinal(text=text):
                return self._likely_final(text.strip())
            case UserResumed():
                if self._user is not None:
                    self._user.likely_verdict = None  # on audio the voice has since gone on from
                if self.state is State.USER_SPEAKING and self._answer is not None:
                    return self._cancel("user_continued", ends_turn=False)  # the answer to the likely final
                if self._user is not None and self._user.released_early:  # ... released: the turn goes on
                    return self._resumed_after_release()
                return []
            case UserFinal(text=text):
                return self._final(text.strip())
            case Silence(ms=ms):
                if self.state is State.USER_PAUSED and self._user is not None:
                    self._user.silence_ms = ms
                    self._user.stalled_ms = 0.0
                    return self._maybe_confirm()
                if self.state is State.USER_SPEAKING and self._user is not None:
                    self._user.silence_ms = ms
                    return self._maybe_release_early()
                return []
            case TurnVerdict(complete=complete, probability=probability):
                if self.state is State.USER_PAUSED and self._user is not None:
                    self._user.verdict, self._user.verdict_probability = complete, probability
                    return self._maybe_confirm()
                return []
            case LikelyVerdict(probability=probability):
                if self.state is State.USER_SPEAKING and self._user is not None:
                    self._user.likely_verdict = probability
                    return self._maybe_release_early()
                return []
            case LmTurnVerdict(answer_id=answer_id, probability=probability):
                if self._is_current(answer_id):
                    assert self._answer is not None
                    self._answer.end_of_turn = probability
                    if self.state is State.USER_PAUSED:
                        return self._maybe_confirm()
                    if self.state is State.USER_SPEAKING:
                        return self._maybe_release_early()
                return []
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
                    self.state = State.SPEAKING
                return []
            case AnswerFinished(answer_id=answer_id):
                return self._answer_finished(answer_id)
            case AssistantAnnounces(text=text):
                return self._announce(text)
        raise TurnTakingError(f"unknown event {event!r}")

    # --- the user's side -------------------------------------------------------------------------------------------
    def _speech_started(self, event: UserSpeechStarted) -> list[TurnAction]:
        state = self.state
        if state is State.LISTENING:
            self._open_turn()
            return []
        if state in (State.USER_SPEAKING, State.BARGE_IN_PENDING):
            return []  # the listener reports one start per segment; a repeat changes nothing
        if state is State.USER_PAUSED:  # the user went on: drop the speculation, same turn
            actions = self._cancel("user_continued", ends_turn=False)
            self.state = State.USER_SPEAKING
            return actions
        if state is State.ANSWERING:  # no audio out yet: the answer is dropped either way, never queued
            if self._continues(event.at_ms):
                actions = self._cancel("user_continued", ends_turn=False)
            else:
                actions = self._cancel("new_turn", ends_turn=True)
                self._open_turn()
            self.state = State.USER_SPEAKING
            return actions
        # SPEAKING: maybe a barge-in, maybe a cough or the assistant's own echo: pause, and wait for words
        self._pending_start_ms = event.at_ms
        self.state = State.BARGE_IN_PENDING
        self._output_paused, self._paused_since_ms = True, None
        answer = self._answer
        assert answer is not None  # SPEAKING always has an answer
        return [PauseOutput(answer.answer_id, answer.turn)]

    def _confirm_barge_in(self) -> list[TurnAction]:
        if self._continues(self._pending_start_ms):
            actions = self._cancel("user_continued", ends_turn=False, clear=True)
        else:
            actions = self._cancel("barge_in", ends_turn=True, clear=True)
            self._open_turn()
        self.state = State.USER_SPEAKING
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
            if not text:
                self.state = State.SPEAKING  # no words: a cough or an echo; the answer plays on
                return self._resume()
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
            self.state = State.LISTENING
            return actions
        user.silence_ms = user.stalled_ms = 0.0
        user.verdict = user.verdict_probability = None
        confirmed = user.done
        started = self._answer
        if started is not None and same_words(started.text, user.text):  # the answer to the likely final's words
            self.state = State.USER_PAUSED
            return self._confirm() if confirmed else []
        actions = self._cancel("transcript_changed", ends_turn=False)
        if not confirmed and not self.config.early_answer:
            self.state = State.USER_PAUSED  # nothing starts until the end of turn is confirmed
            return actions
        user.speculations += 1
        answer = self._new_answer(user.turn, held=not confirmed, spoken_turn=True, text=user.text)
        self.state = State.ANSWERING if confirmed else State.USER_PAUSED
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
        self.state = State.USER_SPEAKING
        return actions

    def _signals(self, user: _UserTurn) -> Signals:
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
        self.state = State.ANSWERING
        if self._answer is not None:
            self._answer.held = False
            return [ReleaseAnswer(self._answer.answer_id)]
        user.speculations += 1
        answer = self._new_answer(user.turn, held=False, spoken_turn=True, text=user.text)
        return [StartAnswer(answer.answer_id, user.turn, user.text, held=False)]

    # --- the shell's clock -----------------------------------------------------------------------------------------
    def _tick(self, tick: ClockTick) -> list[TurnAction]:
        stalled = tick.audio_gap_ms >= self.config.stalled_audio_ms
        if not stalled:
            self._segment_end_asked = False
        if self.state is State.BARGE_IN_PENDING and self._output_paused:
            if self._paused_since_ms is None:
                self._paused_since_ms = tick.now_ms
            elif tick.now_ms - self._paused_since_ms >= self.config.resume_after_ms:
                return self._resume()  # no word in time: play on (words that come later still barge in)
            return []
        if not stalled or self.config.explicit_end or self._user is None:
            return []  # explicit end: the caller ends each turn itself, however long its audio pauses
        if self.state is State.USER_SPEAKING and not self._segment_end_asked:
            self._segment_end_asked = True
            return [EndSegment()]
        if self.state is State.USER_PAUSED:
            self._user.stalled_ms = tick.audio_gap_ms
            return self._maybe_confirm()
        return []

    def _resume(self) -> list[TurnAction]:
        if not self._output_paused or self._answer is None:
            return []
        self._output_paused, self._paused_since_ms = False, None
        return [ResumeOutput(self._answer.answer_id, self._answer.turn)]

    # --- the client ------------------------------------------------------------------------------------------------
    def _typed(self, text: str, continues: bool = False) -> list[TurnAction]:
        actions = self._stop_everything("new_text")
        self.turn_no += 1
        self._user = None
        answer = self._new_answer(self.turn_no, held=False, spoken_turn=False)
        self.state = State.ANSWERING
        actions.append(StartAnswer(answer.answer_id, self.turn_no, text, held=False, continues=continues))
        return actions

    def _announce(self, text: str) -> list[TurnAction]:
        """An announcement takes a turn of its own, like a typed one, but only from a free floor; the user's speech
        barges in on it as on any answer."""
        if self.state is not State.LISTENING or self._answer is not None:
            return []
        self.turn_no += 1
        answer = self._new_answer(self.turn_no, held=False, spoken_turn=False)
        self.state = State.ANSWERING
        return [StartAnswer(answer.answer_id, self.turn_no, text, held=False, announcement=True)]

    def _interrupt(self) -> list[TurnAction]:
        user_was_speaking = self.state in (State.USER_SPEAKING, State.BARGE_IN_PENDING)
        actions = self._stop_everything("interrupt")
        self._user = None
        self.state = State.LISTENING
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
        self._output_paused = False  # the shell finishes an answer only once its audio has played: nothing is paused
        user = self._user
        speculations, dropped = (user.speculations, user.dropped) if user is not None else (0, 0)
        actions: list[TurnAction] = [FinishTurn(answer_id, answer.turn, speculations, dropped)]
        self._user = None
        if self.state is State.BARGE_IN_PENDING:  # the answer ended while the user spoke: that speech is a new turn
            self._open_turn()
            self.state = State.USER_SPEAKING
        else:
            self.state = State.LISTENING
        return actions

    # --- helpers ---------------------------------------------------------------------------------------------------
    def _open_turn(self) -> None:
        self.turn_no += 1
        self._user = _UserTurn(self.turn_no)
        self.state = State.USER_SPEAKING

    def _new_answer(self, turn: int, held: bool, spoken_turn: bool, text: str = "") -> _AnswerState:
        self._answer_ids += 1
        self._answer = _AnswerState(self._answer_ids, turn, held, spoken_turn, text)
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
        self._output_paused = False  # a clear stops the paused audio for good
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
