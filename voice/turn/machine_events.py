"""The turn-taking machine's vocabulary: its states, what goes into it (events: what was heard, decided or played)
and what comes out of it (actions: what the session must do), and its records of the turn and the answer. Plain
records, no behaviour: voice/turn/machine.py holds the transitions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


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


# --- the machine's records of the turn and its answer (mutable: the machine's own) ----------------------------------
@dataclass(slots=True)
class AnswerState:
    """The machine's record of the answer in flight."""

    answer_id: int
    turn: int
    held: bool
    spoken_turn: bool  # answers a spoken turn (continuation applies), not a typed one
    text: str = ""  # the user's words it answers
    end_of_turn: float | None = None  # the LM's P(end of message) after those words (`LmTurnVerdict`)


@dataclass(slots=True)
class UserTurn:
    """The machine's record of the user turn being spoken, paused or answered."""

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
    segment_end_asked: bool = False  # `EndSegment` went out for the current stall of the client's audio

    @property
    def text(self) -> str:
        return " ".join(segment for segment in self.segments if segment)


@dataclass(slots=True)
class Contest:
    """BARGE_IN_PENDING's own record (it exists in that state only): user sound over the answer's audio that has not
    yet proved to be words."""

    started_ms: float  # when the contested speech began, on the audio stream's clock
    paused: bool = True  # the answer's audio is paused (False once it played on: the sound proved wordless, or it took
    # the recogniser too long to tell)
    paused_since_ms: float | None = None  # on the shell's clock: the first tick after the pause


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
class UserNoWords:
    """A decode of the current segment heard no words in its audio through `through_ms` (the stream's clock)."""

    through_ms: float


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


TurnEvent = (UserSpeechStarted | UserSpeechEnded | UserWords | UserNoWords | UserLikelyFinal | UserResumed | UserFinal
             | Silence | LikelyVerdict | TurnVerdict | LmTurnVerdict | UserDone | ClockTick | TypedText
             | ClientInterrupt | AnswerAudio | AnswerFinished | AssistantAnnounces)


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
