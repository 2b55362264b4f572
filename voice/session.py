"""One conversation: listen, understand, answer while refining, speak, and stop the instant the user interrupts.

The session is the async shell around the turn-taking core (`voice.turn_taking.TurnTaking`): it turns what the stages
report into the core's events, and executes the actions the core returns. It decides nothing itself.

    feed_audio -> ListenStage (VAD, endpointer, streaming ASR) -> _on_listen -> TurnTaking.handle -> actions
    StartAnswer -> one answer task: LmRun (diffusion LM in a worker thread) -> drafts -> SpeakStage -> audio
    every stage's events -> the session's event queue -> `events()` (the WebSocket server, the speaker, file mode)

An answer starts at a pause, before the end of turn is sure (speculative end of turn); its events, audio included,
are held back until the core releases it, and vanish if the user goes on speaking. A cancelled answer's events are
dropped from the moment of the decision, so no audio ever follows its `Clear`. A sound during playback pauses the
outputs (`Pause`, then `Resume` or `Clear`); the answer's turn ends only once its audio has played, pauses excluded.

The core takes time as input: a clock task feeds it `ClockTick` (wall time, and how long the session has waited for
audio) every `CLOCK_TICK_S` while the user holds or contests the floor (an idle session does not tick), so a client
that stops sending audio still gets its turn ended, and a paused answer resumes when no word follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import numpy as np

from model.chat import ChatMessage, Draft, GenerationOptions
from model.errors import ModelError
from voice.cancellation import cancel_and_wait
from voice.engines import Engines
from voice.errors import ProtocolError, VoiceError
from voice.events import (
    AnswerDone,
    AudioOut,
    Clear,
    DraftUpdate,
    ErrorEvent,
    Event,
    FirstAudioOut,
    LmFirstPass,
    LmStarted,
    Pause,
    PhraseCommitted,
    Resume,
    SpeechEnd,
    SpeechStart,
    Transcript,
    TtsFirstChunk,
    TurnEnd,
    now_ns,
)
from voice.latency import breakdown
from voice.listen.stage import ListenConfig, ListenStage
from voice.speak.playback_ledger import PlaybackLedger
from voice.speak.speculator import SpeculatorConfig
from voice.speak.stage import SpeakStage
from voice.think.dialogue import Dialogue, DialogueConfig
from voice.think.lm_run import LmRun
from voice.turn_taking import (
    AbandonTurn,
    AnswerAudio,
    AnswerFinished,
    CancelAnswer,
    ClientInterrupt,
    ClockTick,
    EndSegment,
    FinishTurn,
    PauseOutput,
    ReleaseAnswer,
    ResumeOutput,
    Silence,
    StartAnswer,
    State,
    TurnAction,
    TurnEvent,
    TurnTaking,
    TurnTakingConfig,
    TurnVerdict,
    TypedText,
    UserDone,
    UserFinal,
    UserSpeechEnded,
    UserSpeechStarted,
    UserWords,
)

log = logging.getLogger(__name__)

CLOCK_TICK_S = 0.1  # how often the turn-taking core hears the wall clock while the user holds or contests the floor
_CLOCKED_STATES = (State.USER_SPEAKING, State.USER_PAUSED, State.BARGE_IN_PENDING)


@dataclass(frozen=True, slots=True)
class SessionConfig:
    listen: ListenConfig = field(default_factory=ListenConfig)
    speculator: SpeculatorConfig = field(default_factory=SpeculatorConfig)
    dialogue: DialogueConfig = field(default_factory=DialogueConfig)
    generation: GenerationOptions = field(default_factory=lambda: GenerationOptions(max_new_tokens=64))
    turn_taking: TurnTakingConfig = field(default_factory=TurnTakingConfig)
    # Speculative end of turn: start the answer (LM, first phrase's TTS) at the pause, before the end of turn is sure.
    early_lm: bool = True
    full_duplex: bool = True  # False (half duplex): microphone audio is ignored while the assistant speaks
    max_turn_seconds: float = 60.0
    # A turn ends when its audio has had time to play, not when the last chunk was handed out: a user who speaks
    # while the listener still hears the answer is barging in. File mode has no listener and turns this off.
    wait_for_playback: bool = True
    max_text_chars: int = 2000
    log_size: int = 5000  # events kept in `Session.log` (audio chunks excluded)


@dataclass(slots=True)
class _TurnRecord:
    """What the session knows of one user turn (spoken or typed) until its TurnEnd."""

    turn: int
    user_text: str = ""
    marks: dict[str, int] = field(default_factory=dict)
    endpoint_detected_ns: int | None = None


@dataclass(slots=True)
class _Answer:
    """One answer being generated and spoken. Its events pass through `_answer_event`: held while `held`, dropped
    once `cancelled`."""

    answer_id: int
    record: _TurnRecord
    held: bool
    early: bool  # started before the end of turn was confirmed
    task: asyncio.Task[None] | None = None
    run: LmRun | None = None
    released: asyncio.Event = field(default_factory=asyncio.Event)
    held_events: list[Event] = field(default_factory=list)
    cancelled: bool = False
    marks: dict[str, int] = field(default_factory=dict)
    ledger: PlaybackLedger = field(default_factory=PlaybackLedger)
    sample_rate: int = 0
    first_audio_ns: int | None = None
    reported_played: int | None = None  # exact playback position from the output, when it reports one
    unpaused: asyncio.Event = field(default_factory=asyncio.Event)  # clear while the outputs are paused
    paused_at_ns: int | None = None
    paused_ns: int = 0  # time spent paused before `paused_at_ns`
    pauses: int = 0
    answer: str = ""
    stats: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.unpaused.set()

    @property
    def turn(self) -> int:
        return self.record.turn

    def paused_ns_until(self, t_ns: int) -> int:
        """Time this answer's playback has spent paused up to `t_ns`."""
        return self.paused_ns + (t_ns - self.paused_at_ns if self.paused_at_ns is not None else 0)


class Session:
    """One conversation. Many sessions share one `Engines` in a process."""

    def __init__(self, engines: Engines, config: SessionConfig | None = None, session_id: str | None = None) -> None:
        self.engines = engines
        self.config = config or SessionConfig()
        self.id = session_id or uuid.uuid4().hex[:12]
        self.output_sample_rate = engines.tts.sample_rate
        self.dialogue = Dialogue(self.config.dialogue)
        self.log: deque[Event] = deque(maxlen=self.config.log_size)
        self.turn_taking = TurnTaking(replace(self.config.turn_taking, speculate=self.config.early_lm))
        self._out: asyncio.Queue[Event | None] = asyncio.Queue()
        self._listen: ListenStage | None = None
        self._listen_lock = asyncio.Lock()  # the stage takes one call at a time: audio, flush (watchdog), close
        self._records: dict[int, _TurnRecord] = {}
        self._answer: _Answer | None = None
        self._answers_running: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._segment_end: tuple[int, int] | None = None  # (last voiced sample, decided) of the latest segment
        self._turn_audio: list[np.ndarray] = []  # the open user turn's segments, for the turn detector
        self._audio_turn = 0  # the turn `_turn_audio` belongs to
        self._verdict_task: asyncio.Task[None] | None = None
        self._clock_task: asyncio.Task[None] | None = None
        self._waiting_for_audio_since: float | None = None  # monotonic s; None while a chunk is processed
        self._speaking = False
        self._closed = False

    # --- public API ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._listen is None:
            self._listen = ListenStage(self.id, self._on_listen, self.config.listen, model=self.engines.asr)

    async def feed_audio(self, pcm16: bytes, sample_rate: int = 16000) -> None:
        """Microphone audio (PCM16 LE mono). Raises `AudioFormatError` for a bad frame; the session goes on."""
        if self._closed:
            raise ProtocolError("the session is closed")
        if self._listen is None:
            await self.start()
        if self._speaking and not self.config.full_duplex:
            self._waiting_for_audio_since = time.monotonic()
            return  # half duplex: the assistant must not hear (and interrupt) itself through open speakers
        async with self._listen_lock:
            if self._listen is None:
                return
            self._waiting_for_audio_since = None  # a slow step is not a silent client
            try:
                await self._listen.accept(pcm16, sample_rate)
            finally:
                self._waiting_for_audio_since = time.monotonic()
            if self.turn_taking.state is State.USER_PAUSED:
                await self._dispatch(Silence(self._listen.silence_ms))

    async def user_done(self) -> None:
        """The user's turn ends with the speech heard so far (a file's end, push-to-talk released)."""
        await self._dispatch(UserDone())

    async def end_of_audio(self) -> None:
        """The audio stream ended (end of a file, or an utterance cut off): close a turn still open, wait for its
        final transcript, and end the user's turn there."""
        async with self._listen_lock:
            if self._listen is not None:
                await self._listen.flush()
        await self._dispatch(UserDone())

    async def send_text(self, text: str) -> None:
        """A typed user turn; interrupts an answer in progress and takes the floor from an open spoken turn."""
        text = text.strip()
        if not text:
            raise ProtocolError("the text turn is empty")
        if len(text) > self.config.max_text_chars:
            raise ProtocolError(f"the text turn is longer than {self.config.max_text_chars} characters")
        arrived = now_ns()
        actions = self.turn_taking.handle(TypedText(text))
        record = self._record(self.turn_taking.turn_no)
        record.marks["text_in"] = arrived
        await self._execute(actions)
        self._emit(Transcript(session=self.id, turn=record.turn, text=text, committed=text, final=True))

    async def interrupt(self, reason: str = "interrupt") -> None:
        """Stop speaking now: `Clear`, cancel the turn; the history keeps what was played."""
        await self._dispatch(ClientInterrupt())

    def report_played(self, samples: int, turn: int | None = None) -> None:
        """The output says how many samples of the current answer were really played (speaker callback, or the
        browser's `played` message for `turn`; a report about another turn is stale and ignored)."""
        if self._answer is not None and (turn is None or turn == self._answer.turn):
            self._answer.reported_played = samples

    async def wait_idle(self) -> None:
        """Wait until nobody holds the floor and no answer is in progress (file mode and tests)."""
        while True:
            await self._idle.wait()
            await asyncio.sleep(0)  # let a task that just finished deliver its last events
            if self._idle.is_set():
                return

    async def events(self) -> AsyncIterator[Event]:
        while (event := await self._out.get()) is not None:
            yield event

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        answer, self._answer = self._answer, None
        if answer is not None:
            answer.cancelled = True
            await self._stop_answer(answer)
        await cancel_and_wait(*self._answers_running, self._verdict_task, self._clock_task)
        async with self._listen_lock:
            if self._listen is not None:
                await self._listen.aclose()
        self._out.put_nowait(None)

    # --- listening -------------------------------------------------------------------------------------------------
    async def _on_listen(self, event: Event) -> None:
        """The listener's events become the core's; they go out tagged with the turn the core says they belong to."""
        machine = self.turn_taking
        if isinstance(event, SpeechStart):
            await cancel_and_wait(self._verdict_task)  # that pause's verdict is moot: the user spoke again
            await self._dispatch(UserSpeechStarted(self._listen.speech_start_ms if self._listen else 0.0))
            self._emit(replace(event, turn=machine.user_turn))
        elif isinstance(event, SpeechEnd):
            self._segment_end = (event.t_ns, event.detected_ns)
            await self._dispatch(UserSpeechEnded(self._listen.speech_end_ms if self._listen else 0.0))
            self._emit(replace(event, turn=machine.user_turn))
        elif isinstance(event, Transcript) and not event.final:
            self._emit(replace(event, turn=machine.user_turn))
            if event.text.strip():
                await self._dispatch(UserWords())
        elif isinstance(event, Transcript):
            actions = machine.handle(UserFinal(event.text))
            turn = machine.user_turn
            if machine.state in (State.USER_PAUSED, State.ANSWERING) and self._segment_end is not None:
                # the turn's timing is its last segment's: voice-to-voice counts from the last word said
                record = self._record(turn)
                record.marks["speech_end"], record.endpoint_detected_ns = self._segment_end
                record.marks["asr_final"] = event.t_ns
            self._segment_end = None
            self._emit(replace(event, turn=turn))
            await self._execute(actions)
            if machine.state is State.USER_PAUSED:
                self._judge_turn(turn)

    def _judge_turn(self, turn: int) -> None:
        """Ask the turn detector, in a thread, whether the paused turn sounds finished; its verdict arrives as an
        event and moves the end of turn earlier or later (no detector: the silence rule alone)."""
        detector, listen = self.engines.turn_detector, self._listen
        if detector is None or listen is None:
            return
        if self._audio_turn != turn:
            self._turn_audio, self._audio_turn = [], turn
        self._turn_audio.append(listen.last_segment_audio)
        window = int(detector.config.max_seconds * 16000)
        audio = np.concatenate(self._turn_audio)[-window:]
        self._turn_audio = [audio]

        async def judge() -> None:
            try:
                complete = await asyncio.to_thread(detector.is_complete, audio)
            except VoiceError as err:  # audio it cannot judge: the silence rule decides this pause
                log.warning("turn detector: %s", err)
                return
            await self._dispatch(TurnVerdict(complete))

        self._verdict_task = asyncio.create_task(judge(), name=f"turn-verdict-{self.id}-{turn}")

    def _start_clock(self) -> None:
        """Run the clock while the user holds or contests the floor (an idle session does not tick)."""
        if self._closed or self.turn_taking.state not in _CLOCKED_STATES:
            return
        if self._clock_task is None or self._clock_task.done():
            self._clock_task = asyncio.create_task(self._run_clock(), name=f"turn-clock-{self.id}")

    async def _run_clock(self) -> None:
        """Feed the core the wall clock while it may need it; it reads no clock itself."""
        while True:
            await asyncio.sleep(CLOCK_TICK_S)
            if self.turn_taking.state not in _CLOCKED_STATES:
                return
            now = time.monotonic()
            since = self._waiting_for_audio_since
            await self._dispatch(ClockTick(now * 1000, 0.0 if since is None else (now - since) * 1000))

    async def _end_segment(self) -> None:
        """The client stopped sending audio mid-speech: close the open segment as the end of a stream would, and
        tell the core how much silence the audio held; the wall clock counts on from there."""
        async with self._listen_lock:
            if self._listen is None:
                return
            try:
                await self._listen.flush()
            except VoiceError as err:  # that segment's decode failed: the turn has no final, the session goes on
                self._emit(ErrorEvent(session=self.id, turn=self.turn_taking.user_turn, code=err.code,
                                      message=str(err)))
                return
            silence_ms = self._listen.silence_ms
        if self.turn_taking.state is State.USER_PAUSED:
            await self._dispatch(Silence(silence_ms))

    async def _dispatch(self, event: TurnEvent) -> None:
        await self._execute(self.turn_taking.handle(event))

    async def _execute(self, actions: list[TurnAction]) -> None:
        for action in actions:
            match action:
                case StartAnswer():
                    self._start_answer(action)
                case ReleaseAnswer(answer_id=answer_id):
                    if self._answer is not None and self._answer.answer_id == answer_id:
                        self._release(self._answer)
                case CancelAnswer():
                    await self._cancel_answer(action)
                case FinishTurn():
                    self._finish_answered(action)
                case AbandonTurn(turn=turn, text=text):
                    record = self._record(turn)
                    record.user_text = text
                    self._end_turn(record, None, interrupted=True, stats={})
                case PauseOutput(answer_id=answer_id):
                    self._pause(answer_id)
                case ResumeOutput(answer_id=answer_id):
                    self._resume(answer_id)
                case EndSegment():
                    await self._end_segment()
        self._update_idle()

    def _record(self, turn: int) -> _TurnRecord:
        record = self._records.get(turn)
        if record is None:
            record = self._records[turn] = _TurnRecord(turn)
        return record

    def _messages_with(self, user_text: str) -> list[ChatMessage]:
        """The history plus this turn's words; the history itself changes only when the turn ends."""
        probe = Dialogue(self.dialogue.config)
        for message in self.dialogue.history:
            (probe.add_user if message.role == "user" else probe.add_assistant)(message.content)
        probe.add_user(user_text)
        return probe.messages()

    # --- answering -------------------------------------------------------------------------------------------------
    def _start_answer(self, action: StartAnswer) -> None:
        record = self._record(action.turn)
        record.user_text = action.text
        answer = _Answer(action.answer_id, record, held=action.held, early=action.held)
        if not action.held:
            answer.released.set()
        self._answer = answer
        answer.task = asyncio.create_task(self._run_answer(answer, self._messages_with(action.text)),
                                          name=f"answer-{self.id}-{action.turn}-{action.answer_id}")
        self._answers_running.add(answer.task)
        answer.task.add_done_callback(self._answers_running.discard)

    def _release(self, answer: _Answer) -> None:
        answer.held = False
        held, answer.held_events = answer.held_events, []
        for event in held:
            self._deliver(answer, event)
        answer.released.set()

    def _pause(self, answer_id: int) -> None:
        answer = self._answer
        if answer is None or answer.answer_id != answer_id or answer.paused_at_ns is not None:
            return
        answer.paused_at_ns = now_ns()
        answer.pauses += 1
        answer.unpaused.clear()
        self._emit(Pause(session=self.id, turn=answer.turn, t_ns=answer.paused_at_ns))

    def _resume(self, answer_id: int) -> None:
        answer = self._answer
        if answer is None or answer.answer_id != answer_id or answer.paused_at_ns is None:
            return
        resumed = now_ns()
        answer.paused_ns = answer.paused_ns_until(resumed)
        answer.paused_at_ns = None
        answer.unpaused.set()
        self._emit(Resume(session=self.id, turn=answer.turn, t_ns=resumed))

    async def _cancel_answer(self, action: CancelAnswer) -> None:
        answer = self._answer
        if answer is None or answer.answer_id != action.answer_id:
            return
        self._answer = None
        answer.cancelled = True  # from now on nothing of this answer goes out: no audio after the Clear
        if action.clear and answer.first_audio_ns is not None:
            self._emit(Clear(session=self.id, turn=answer.turn, reason=action.reason))
        self._speaking = False
        await self._stop_answer(answer)
        if action.continues_as is not None:
            record = self._records.pop(answer.turn, answer.record)
            record.turn = action.continues_as
            self._records[record.turn] = record
        if action.ends_turn:
            answer.stats.update(speculations=action.speculations, speculations_dropped=action.dropped)
            self._end_turn(answer.record, answer, interrupted=True, stats=answer.stats)

    async def _stop_answer(self, answer: _Answer) -> None:
        await cancel_and_wait(answer.task)
        if answer.run is not None:
            await answer.run.close()

    def _finish_answered(self, action: FinishTurn) -> None:
        answer = self._answer
        if answer is None or answer.answer_id != action.answer_id:
            return
        self._answer = None
        answer.stats.update(speculations=action.speculations, speculations_dropped=action.dropped)
        self._end_turn(answer.record, answer, interrupted=False, stats=answer.stats)

    async def _run_answer(self, answer: _Answer, messages: list[ChatMessage]) -> None:
        run = LmRun(self.engines.lm, messages, self.config.generation, f"lm-{self.id}-{answer.turn}")
        answer.run = run
        answer.stats["early_lm"] = 1.0 if answer.early else 0.0
        self._answer_event(answer, LmStarted(session=self.id, turn=answer.turn, t_ns=run.started_ns,
                                             early=answer.early))
        try:
            async with asyncio.timeout(self.config.max_turn_seconds):
                await self._answer_body(answer, run)
            await answer.released.wait()  # an answer ready before its end of turn was confirmed waits for it
            await self._until_played(answer)
        except TimeoutError:
            self._emit_error(answer, "turn_timeout", f"the turn took longer than {self.config.max_turn_seconds} s")
        except (ModelError, VoiceError) as err:
            self._emit_error(answer, getattr(err, "code", "model_error"), str(err))
        except Exception as err:  # the turn boundary: a bug in one stage ends this turn, never the session
            log.exception("turn %s failed", answer.turn)
            self._emit_error(answer, "internal_error", f"{type(err).__name__}: {err}")
        finally:
            await run.close()
        if answer.cancelled:
            return
        await answer.released.wait()  # a failed answer still waits: its error belongs to a confirmed turn
        if self._answer is answer:
            self._speaking = False
        # synchronous from here: the core learns of the end and the turn ends, with no other step in between
        self._execute_now(self.turn_taking.handle(AnswerFinished(answer.answer_id)))

    async def _until_played(self, answer: _Answer) -> None:
        """Wait until the answer's audio has had time to play (no wait without `wait_for_playback`); a pause, even
        one that begins during the wait, moves that moment later."""
        while True:
            await answer.unpaused.wait()
            pauses = answer.pauses
            left = self._playback_left(answer) if self.config.wait_for_playback else 0.0
            if left > 0:
                await asyncio.sleep(left)
            if answer.pauses == pauses and answer.unpaused.is_set():
                return

    def _execute_now(self, actions: list[TurnAction]) -> None:
        for action in actions:
            if isinstance(action, FinishTurn):
                self._finish_answered(action)
            else:  # the core answers an answer's end with FinishTurn only
                raise RuntimeError(f"unexpected action at an answer's end: {action!r}")
        self._update_idle()

    async def _answer_body(self, answer: _Answer, run: LmRun) -> None:
        drafts: asyncio.Queue[Draft | None] = asyncio.Queue(maxsize=256)
        speaker = SpeakStage(
            self.engines.tts,
            lambda event: self._on_speech(answer, event),
            session=self.id,
            turn=answer.turn,
            config=self.config.speculator,
            ledger=answer.ledger,
        )
        answer.sample_rate = speaker.sample_rate
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pump(answer, run, drafts), name=f"lm-pump-{self.id}-{answer.turn}")
                report = await speaker.run(drafts)
        except BaseExceptionGroup as failures:
            # One failing stage (the model, the voice) ends the turn with its own typed error, not a group.
            first = next((e for e in failures.exceptions if isinstance(e, Exception)), None)
            if first is None:
                raise
            raise first from None
        answer.stats.update(
            hits=report.hits,
            misses=report.misses,
            speculation_none=report.nones,
            saved_ms=report.saved_ms,
            wasted_ms=report.wasted_ms,
            wasted_cpu_ms=report.wasted_cpu_ms,
        )

    async def _pump(self, answer: _Answer, run: LmRun, drafts: asyncio.Queue[Draft | None]) -> None:
        first = True
        passes = 0
        lm_seconds = 0.0
        try:
            async for t_ns, draft in run.drafts():
                passes += 1
                lm_seconds += draft.elapsed_s
                if first:
                    first = False
                    answer.marks["lm_first_pass"] = t_ns
                    self._answer_event(answer, LmFirstPass(session=self.id, turn=answer.turn, t_ns=t_ns))
                self._answer_event(
                    answer,
                    DraftUpdate(
                        session=self.id,
                        turn=answer.turn,
                        step=draft.step,
                        committed=draft.committed_text,
                        draft=draft.text,
                        pieces=tuple((piece.text, piece.committed) for piece in draft.pieces),
                    ),
                )
                await drafts.put(draft)
                if draft.done:
                    answer.answer = draft.committed_text.strip() or draft.text.strip()
                    tokens = draft.completion_tokens
                    # the end-of-sequence token is generated work too (as in scripts/eval_default_model.py)
                    generated = tokens + (1 if draft.finish_reason == "stop" else 0)
                    answer.stats.update(
                        tokens=tokens,
                        passes=passes,
                        tokens_per_pass=generated / passes if passes else 0.0,
                        lm_seconds=lm_seconds,
                        tokens_per_second=generated / lm_seconds if lm_seconds > 0 else 0.0,
                        prompt_tokens=draft.prompt_tokens,
                        prompt_tokens_encoded=draft.prompt_tokens - draft.cached_prompt_tokens,
                    )
                    self._answer_event(
                        answer,
                        AnswerDone(
                            session=self.id,
                            turn=answer.turn,
                            text=answer.answer,
                            tokens=tokens,
                            passes=passes,
                            lm_seconds=lm_seconds,
                            finish_reason=draft.finish_reason or "stop",
                        ),
                    )
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                drafts.put_nowait(None)

    async def _on_speech(self, answer: _Answer, event: Event) -> None:
        if isinstance(event, PhraseCommitted):
            answer.marks.setdefault("first_phrase_committed", event.t_ns)
        elif isinstance(event, TtsFirstChunk):
            answer.marks.setdefault("tts_first_chunk", event.t_ns)
        self._answer_event(answer, event)

    def _answer_event(self, answer: _Answer, event: Event) -> None:
        """Every event of an answer comes through here: dropped once cancelled, held until released."""
        if answer.cancelled:
            return
        if answer.held:
            answer.held_events.append(event)
            return
        self._deliver(answer, event)

    def _deliver(self, answer: _Answer, event: Event) -> None:
        if isinstance(event, AudioOut) and answer.first_audio_ns is None:
            self._speaking = True
            answer.first_audio_ns = now_ns()
            answer.marks["first_audio_out"] = answer.first_audio_ns
            self._emit(FirstAudioOut(session=self.id, turn=answer.turn, t_ns=answer.first_audio_ns))
            self.turn_taking.handle(AnswerAudio(answer.answer_id))  # no actions: it only moves to SPEAKING
        self._emit(event)

    def _end_turn(self, record: _TurnRecord, answer: _Answer | None, interrupted: bool,
                  stats: dict[str, float]) -> None:
        self._records.pop(record.turn, None)
        if answer is None:
            answer_text, spoken, marks = "", "", dict(record.marks)
        else:
            marks = {**record.marks, **answer.marks}
            answer_text = answer.answer
            if interrupted:
                answer.ledger.played_total(self._played_estimate(answer))
                spoken = answer.ledger.spoken_text()
            else:
                spoken = answer.answer
        self.dialogue.add_user(record.user_text)
        self.dialogue.add_assistant(spoken)
        self._emit(
            TurnEnd(
                session=self.id,
                turn=record.turn,
                user_text=record.user_text,
                answer=answer_text,
                spoken=spoken,
                interrupted=interrupted,
                latency_ms=breakdown(marks, record.endpoint_detected_ns),
                stats=dict(stats),
            )
        )

    def _playback_left(self, answer: _Answer) -> float:
        """Seconds until the audio handed out so far has played, assuming playback started with the first chunk."""
        if answer.first_audio_ns is None or not answer.sample_rate:
            return 0.0
        played = self._played_estimate(answer)
        return max(0.0, (answer.ledger.samples_out() - played) / answer.sample_rate)

    def _played_estimate(self, answer: _Answer) -> int:
        """Samples the listener heard: the output's own report, else real time since the first sample went out, less
        the time playback was paused."""
        if answer.reported_played is not None:
            return answer.reported_played
        if answer.first_audio_ns is None or not answer.sample_rate:
            return 0
        now = now_ns()
        return int((now - answer.first_audio_ns - answer.paused_ns_until(now)) * answer.sample_rate / 1e9)

    def _emit_error(self, answer: _Answer, code: str, message: str) -> None:
        self._answer_event(answer, ErrorEvent(session=self.id, turn=answer.turn, code=code, message=message))

    def _update_idle(self) -> None:
        """After every transition: whether the session is idle, and whether the core needs the clock."""
        if self.turn_taking.state is State.LISTENING and self._answer is None:
            self._idle.set()
        else:
            self._idle.clear()
        self._start_clock()

    def _emit(self, event: Event) -> None:
        if not isinstance(event, AudioOut):
            self.log.append(event)
        if not self._closed:
            self._out.put_nowait(event)
