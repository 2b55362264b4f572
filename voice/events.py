"""Every event that travels between the pipeline's stages, and out to clients.

Events are frozen, slotted dataclasses stamped with `time.monotonic_ns()`. The latency report is a fold over the event
log, so a stage must emit each event when the thing it names really happened (for `SpeechEnd`: when the last voiced
sample arrived, not when the endpointer noticed).

Latency marks (see `LATENCY_MARKS`) are the events a turn's breakdown is computed from;
voice-to-voice latency = first_audio_out - speech_end.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


def now_ns() -> int:
    return time.monotonic_ns()


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    session: str
    turn: int
    t_ns: int = field(default_factory=now_ns)

    @property
    def type(self) -> str:
        return EVENT_TYPES[type(self)]


# How a stage hands its events on: awaited, so the receiver sees them in order before the stage goes on.
Emit = Callable[[Event], Awaitable[None]]


# --- listening -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStart(Event):
    """The endpointer saw speech begin; `t_ns` is when the first voiced sample arrived."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechEnd(Event):
    """The user stopped speaking. `t_ns` is when the last voiced sample arrived; `detected_ns` when the endpointer
    decided (after its minimum silence), so endpoint delay = detected_ns - t_ns."""

    detected_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Transcript(Event):
    """A partial (`final=False`) or final transcript of the current user turn. `committed` is the prefix that
    LocalAgreement has fixed; `text` is the whole current hypothesis. `likely_final`: a partial that is the
    segment's final unless the voice comes back (its speech was followed by silence and decoded whole)."""

    text: str
    committed: str
    final: bool
    likely_final: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class VoiceResumed(Event):
    """The user's voice came back inside the current segment after its likely final (a pause too short to end it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NoWords(Event):
    """A decode of the open segment heard no words in its audio through `through_ms` (the stream's clock): so far a
    sound, not speech. The session's own (a sound over the answer proves wordless this way); not sent to clients."""

    through_ms: float


# --- thinking --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class LmStarted(Event):
    """The LM began work on this turn's prompt (`early` when started before the final transcript)."""

    early: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftUpdate(Event):
    """One refinement pass of the answer, as text: `committed` can no longer change, `draft` is the whole current
    guess (committed text first). `pieces` pairs each token's text with whether it is committed."""

    step: int
    committed: str
    draft: str
    pieces: tuple[tuple[str, bool], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LmFirstPass(Event):
    """The first denoising pass of the answer finished."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerDone(Event):
    """The LM finished the answer. `passes` and `tokens` give tokens per pass (both over every round of the tool
    loop); `lm_seconds` the model time; `prompt_tokens` the prompts the LM read, of which `cached_prompt_tokens` came
    from its cache (every round too; 0 from a model that does not count them)."""

    text: str
    tokens: int
    passes: int
    lm_seconds: float
    finish_reason: str
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCalled(Event):
    """The session ran a tool the answer called (voice/tools/); `t_ns` is when it returned. `error`: the reason said
    to the user when it failed ("" when it worked). Internal: a tool call is never spoken nor sent to a client."""

    name: str
    arguments: str
    result: str
    error: str
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolRequested(Event):
    """The answer called a function whose result comes from outside (a Realtime client's own tool): the turn ends
    with the call, unanswered; its result comes back by `call_id` (`Session.add_tool_result`)."""

    name: str
    arguments: str
    call_id: str


# --- speaking --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class PhraseCommitted(Event):
    """A phrase of the answer became final and may be spoken."""

    phrase_id: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculationResult(Event):
    """How a committed phrase got its audio: `hit` (the speculative render matched), `miss` (render was discarded and
    redone), or `none` (no speculative render was ready or started). `saved_ms` is synthesis time taken off the
    critical path."""

    phrase_id: int
    outcome: str
    saved_ms: float = 0.0
    wasted_ms: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TtsFirstChunk(Event):
    """The first synthesised audio of this turn is ready (it may still wait for its phrase to commit)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioStart(Event):
    """The assistant starts speaking this turn; `sample_rate` of the PCM that follows."""

    sample_rate: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioOut(Event):
    """A chunk of assistant PCM16 LE mono audio handed to the speaker or socket."""

    pcm: bytes
    sample_rate: int
    phrase_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstAudioOut(Event):
    """The first assistant sample of this turn was handed to the speaker or socket."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioEnd(Event):
    """The assistant finished speaking this turn (all audio handed out)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Clear(Event):
    """Stop playback now and drop queued assistant audio (barge-in or interrupt)."""

    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause(Event):
    """Stop playing this turn's audio for now and keep what is queued: the user made a sound that may be a barge-in.
    A `Resume` (the sound was not words) or a `Clear` (it was) follows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume(Event):
    """Play this turn's paused audio on from where it stopped."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnd(Event):
    """The turn is over. `latency_ms` maps stage names to milliseconds; `spoken` is what the user actually heard."""

    user_text: str
    answer: str
    spoken: str
    interrupted: bool
    latency_ms: dict[str, float]
    stats: dict[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEvent(Event):
    """Something failed; the turn ends, the session goes on. `code` is stable and machine-readable."""

    code: str
    message: str


EVENT_TYPES: dict[type[Event], str] = {
    SpeechStart: "speech_start",
    SpeechEnd: "speech_end",
    Transcript: "transcript",
    VoiceResumed: "voice_resumed",
    NoWords: "no_words",
    LmStarted: "lm_started",
    DraftUpdate: "draft",
    LmFirstPass: "lm_first_pass",
    AnswerDone: "answer",
    ToolCalled: "tool_called",
    ToolRequested: "tool_requested",
    PhraseCommitted: "phrase_committed",
    SpeculationResult: "speculation",
    TtsFirstChunk: "tts_first_chunk",
    AudioStart: "audio_start",
    AudioOut: "audio",
    FirstAudioOut: "first_audio_out",
    AudioEnd: "audio_end",
    Clear: "clear",
    Pause: "pause",
    Resume: "resume",
    TurnEnd: "turn_end",
    ErrorEvent: "error",
}

# The named timestamps of a turn, in pipeline order (the latency names of README.md, "Protocols"; voice/latency.py
# folds them into the stage breakdown).
LATENCY_MARKS: tuple[str, ...] = (
    "speech_end",
    "asr_final",
    "lm_first_pass",
    "first_phrase_committed",
    "tts_first_chunk",
    "first_audio_out",
)
