"""One conversation: listen, understand, answer while refining, speak, and stop the instant the user interrupts.

The session is the async shell around the turn-taking core (`voice.turn.machine.TurnTaking`): it turns what the stages
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

The parts: voice/turn/answer.py runs an answer and gates its events, voice/turn/clock.py is the clock,
voice/turn/records.py keeps each turn's record and ends it into the history, and voice/turn/detector_schedule.py
decides when the turn detector is asked and whether its verdict still applies (this module runs it in a thread).
This module wires them to the core.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np

from model.chat import ChatMessage, PreparesPrompts
from model.errors import ModelError
from voice.cancellation import cancel_and_wait
from voice.engines import Engines
from voice.errors import ProtocolError, VoiceError
from voice.events import (
    AudioOut,
    Clear,
    ErrorEvent,
    Event,
    Pause,
    Resume,
    SpeechEnd,
    SpeechStart,
    Transcript,
    VoiceResumed,
    now_ns,
)
from voice.listen.stage import ListenStage
from voice.think.dialogue import Dialogue
from voice.turn.answer import Answer, AnswerRunner
from voice.turn.clock import TurnClock
from voice.turn.config import SessionConfig
from voice.turn.detector_schedule import (
    AskDetector,
    AwaitVerdict,
    DeliverVerdict,
    DetectorAction,
    DetectorAnswered,
    DetectorEvent,
    DetectorSchedule,
    DropVerdict,
    LikelyFinalHeard,
    ScheduleClosed,
    TurnPaused,
    UserSpoke,
)
from voice.turn.machine import (
    AbandonTurn,
    AnswerAudio,
    AnswerFinished,
    CancelAnswer,
    ClientInterrupt,
    EndSegment,
    FinishTurn,
    LmTurnVerdict,
    PauseOutput,
    ReleaseAnswer,
    ResumeOutput,
    Silence,
    StartAnswer,
    State,
    TurnAction,
    TurnEvent,
    TurnTaking,
    TypedText,
    UserDone,
    UserFinal,
    UserLikelyFinal,
    UserResumed,
    UserSpeechEnded,
    UserSpeechStarted,
    UserWords,
)
from voice.turn.records import TurnRecord, TurnRecords

log = logging.getLogger(__name__)


def _starts_answer(actions: list[TurnAction]) -> bool:
    return any(isinstance(action, StartAnswer) for action in actions)


def _retrieve(future: asyncio.Future[bool]) -> None:
    if not future.cancelled():
        future.exception()


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
        self._records = TurnRecords(self.id, self.dialogue)
        self._answers = AnswerRunner(engines, self.config, self.id, self._emit, self._on_first_audio)
        self._answers.on_end_of_turn = self._on_lm_end_of_turn
        self._answer: Answer | None = None
        self._answers_running: set[asyncio.Task[None]] = set()
        self._clock = TurnClock(self.turn_taking, self._dispatch, name=f"turn-clock-{self.id}")
        self._idle = asyncio.Event()
        self._idle.set()
        self._segment_end: tuple[int, int] | None = None  # (last voiced sample, decided) of the latest segment
        detector = engines.turn_detector
        self._detector_schedule = (
            None if detector is None else DetectorSchedule(detector.config.threshold, detector.config.max_seconds)
        )
        self._verdicts: dict[int, asyncio.Future[float]] = {}  # the detector's requests running in a thread
        self._verdict_tasks: dict[int, asyncio.Task[None]] = {}  # the requests a paused turn waits for
        self._speaking = False
        self._closed = False
        self._prepared: threading.Event | None = None  # cancels the next prompt's encoding ahead, while it waits
        self._likely_final_ns: int | None = None  # when the likely final the held answer started from came

    # --- public API ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._listen is None:
            self._listen = ListenStage(self.id, self._on_listen, self.config.listen, model=self.engines.asr)
            self._listen.on_likely_final = self._on_likely_final
            self._prepare_next_prompt()

    async def feed_audio(self, pcm16: bytes, sample_rate: int = 16000) -> None:
        """Microphone audio (PCM16 LE mono). Raises `AudioFormatError` for a bad frame; the session goes on."""
        if self._closed:
            raise ProtocolError("the session is closed")
        if self._listen is None:
            await self.start()
        if self._speaking and not self.config.full_duplex:
            self._clock.waiting_for_audio()
            return  # half duplex: the assistant must not hear (and interrupt) itself through open speakers
        async with self._listen_lock:
            if self._listen is None:
                return
            self._clock.processing_audio()
            try:
                await self._listen.accept(pcm16, sample_rate)
            finally:
                self._clock.waiting_for_audio()
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
        record = self._records.get(self.turn_taking.turn_no)
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
        self._drop_prepared()
        dropped = self._schedule_detector(ScheduleClosed())
        answer, self._answer = self._answer, None
        if answer is not None:
            answer.cancelled = True
            await self._answers.stop(answer)
        await cancel_and_wait(*self._answers_running, *dropped, *self._verdict_tasks.values(), self._clock.task)
        async with self._listen_lock:
            if self._listen is not None:
                await self._listen.aclose()
        self._out.put_nowait(None)

    # --- listening -------------------------------------------------------------------------------------------------
    async def _on_listen(self, event: Event) -> None:
        """The listener's events become the core's; they go out tagged with the turn the core says they belong to."""
        machine = self.turn_taking
        if isinstance(event, SpeechStart):
            await cancel_and_wait(*self._schedule_detector(UserSpoke()))  # that pause's verdict is moot
            await self._dispatch(UserSpeechStarted(self._listen.speech_start_ms if self._listen else 0.0))
            self._emit(replace(event, turn=machine.user_turn))
        elif isinstance(event, SpeechEnd):
            self._segment_end = (event.t_ns, event.detected_ns)
            await self._dispatch(UserSpeechEnded(self._listen.speech_end_ms if self._listen else 0.0))
            self._emit(replace(event, turn=machine.user_turn))
        elif isinstance(event, VoiceResumed):
            self._likely_final_ns = None
            self._emit(replace(event, turn=machine.user_turn))
            await self._dispatch(UserResumed())
        elif isinstance(event, Transcript) and not event.final:
            self._emit(replace(event, turn=machine.user_turn))
            if event.text.strip():
                await self._dispatch(UserWords())
            if event.likely_final:
                actions = machine.handle(UserLikelyFinal(event.text))
                if _starts_answer(actions):
                    self._likely_final_ns = event.t_ns  # the transcript this answer started from
                await self._execute(actions)
        elif isinstance(event, Transcript):
            actions = machine.handle(UserFinal(event.text))
            turn = machine.user_turn
            kept = None if _starts_answer(actions) else self._likely_final_ns
            self._likely_final_ns = None
            if machine.state in (State.USER_PAUSED, State.ANSWERING) and self._segment_end is not None:
                # the turn's timing is its last segment's: voice-to-voice counts from the last word said; its
                # transcript is the one its answer started from (the likely final, when the answer kept it)
                record = self._records.get(turn)
                record.marks["speech_end"], record.endpoint_detected_ns = self._segment_end
                record.marks["asr_final"] = kept if kept is not None else event.t_ns
            self._segment_end = None
            self._emit(replace(event, turn=turn))
            await self._execute(actions)
            if machine.state is State.USER_PAUSED:
                self._judge_turn(turn)

    def _on_likely_final(self, segment: np.ndarray) -> None:
        """The listener starts the segment's likely final decode; `segment` is the segment's audio if the user stays
        silent: the detector may judge it now (voice/turn/detector_schedule.py says when and whether it applies)."""
        self._schedule_detector(LikelyFinalHeard(self.turn_taking.user_turn, segment))

    def _judge_turn(self, turn: int) -> None:
        """The paused turn needs the detector's verdict; it arrives as an event and moves the end of turn earlier or
        later (no detector: the silence rule alone)."""
        if self._listen is not None:
            self._schedule_detector(TurnPaused(turn, self._listen.last_segment_audio))

    def _schedule_detector(self, event: DetectorEvent) -> list[asyncio.Task[None]]:
        """Execute the detector schedule's actions for `event`; returns the cancelled waits, for the caller to wait
        out (`cancel_and_wait`)."""
        if self._detector_schedule is None:
            return []
        return self._execute_detector(self._detector_schedule.handle(event))

    def _execute_detector(self, actions: list[DetectorAction]) -> list[asyncio.Task[None]]:
        detector = self.engines.turn_detector
        assert detector is not None, "a detector schedule exists only with a detector"
        dropped: list[asyncio.Task[None]] = []
        for action in actions:
            match action:
                case AskDetector(request=request, audio=audio):
                    verdict = asyncio.ensure_future(asyncio.to_thread(detector.probability, audio))
                    verdict.add_done_callback(_retrieve)  # a verdict dropped unread must not log "never retrieved"
                    self._verdicts[request] = verdict
                case AwaitVerdict(request=request, turn=turn):
                    self._verdict_tasks[request] = asyncio.create_task(
                        self._await_verdict(request), name=f"turn-verdict-{self.id}-{turn}"
                    )
                case DropVerdict(request=request):
                    if (verdict := self._verdicts.pop(request, None)) is not None:
                        verdict.cancel()
                    if (task := self._verdict_tasks.pop(request, None)) is not None:
                        task.cancel()
                        dropped.append(task)
                case DeliverVerdict():
                    raise RuntimeError("a verdict is delivered only from its wait")
        return dropped

    async def _await_verdict(self, request: int) -> None:
        assert self._detector_schedule is not None
        try:
            try:
                probability = await self._verdicts[request]
            except VoiceError as err:  # audio it cannot judge: the silence rule decides this pause
                log.warning("turn detector: %s", err)
                return
            finally:
                self._verdicts.pop(request, None)
            for action in self._detector_schedule.handle(DetectorAnswered(request, probability)):
                if isinstance(action, DeliverVerdict):
                    await self._dispatch(action.verdict)
        finally:
            self._verdict_tasks.pop(request, None)  # until here `close` cancels it, delivering or not

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

    # --- executing the core's actions --------------------------------------------------------------------------------
    async def _dispatch(self, event: TurnEvent) -> None:
        await self._execute(self.turn_taking.handle(event))

    async def _execute(self, actions: list[TurnAction]) -> None:
        for action in actions:
            match action:
                case StartAnswer():
                    self._start_answer(action)
                case ReleaseAnswer(answer_id=answer_id):
                    if self._answer is not None and self._answer.answer_id == answer_id:
                        self._answers.release(self._answer)
                case CancelAnswer():
                    await self._cancel_answer(action)
                case FinishTurn():
                    self._finish_answered(action)
                case AbandonTurn(turn=turn, text=text):
                    record = self._records.get(turn)
                    record.user_text = text
                    self._end_turn(record, None, interrupted=True, stats={})
                case PauseOutput(answer_id=answer_id):
                    self._pause(answer_id)
                case ResumeOutput(answer_id=answer_id):
                    self._resume(answer_id)
                case EndSegment():
                    await self._end_segment()
        self._update_idle()

    def _execute_now(self, actions: list[TurnAction]) -> None:
        for action in actions:
            if isinstance(action, FinishTurn):
                self._finish_answered(action)
            else:  # the core answers an answer's end with FinishTurn only
                raise RuntimeError(f"unexpected action at an answer's end: {action!r}")
        self._update_idle()

    def _start_answer(self, action: StartAnswer) -> None:
        self._drop_prepared()
        record = self._records.get(action.turn)
        record.user_text = action.text
        answer = Answer(action.answer_id, record, held=action.held, early=action.held)
        if not action.held:
            answer.released.set()
        self._answer = answer
        answer.task = asyncio.create_task(self._run_answer(answer, self._records.messages_with(action.text)),
                                          name=f"answer-{self.id}-{action.turn}-{action.answer_id}")
        self._answers_running.add(answer.task)
        answer.task.add_done_callback(self._answers_running.discard)

    async def _run_answer(self, answer: Answer, messages: list[ChatMessage]) -> None:
        await self._answers.run(answer, messages)
        if answer.cancelled:
            return
        await answer.released.wait()  # a failed answer still waits: its error belongs to a confirmed turn
        if self._answer is answer:
            self._speaking = False
        # synchronous from here: the core learns of the end and the turn ends, with no other step in between
        self._execute_now(self.turn_taking.handle(AnswerFinished(answer.answer_id)))

    async def _on_lm_end_of_turn(self, answer: Answer, probability: float) -> None:
        """The answer's first pass read the LM's end-of-turn probability: the core weighs it with the detector's."""
        if self._answer is answer:
            await self._dispatch(LmTurnVerdict(answer.answer_id, probability))

    def _on_first_audio(self, answer: Answer) -> None:
        self._speaking = True
        self.turn_taking.handle(AnswerAudio(answer.answer_id))  # no actions: it only moves to SPEAKING

    def _pause(self, answer_id: int) -> None:
        answer = self._answer
        if answer is None or answer.answer_id != answer_id or not answer.pause(now_ns()):
            return
        self._emit(Pause(session=self.id, turn=answer.turn, t_ns=answer.paused_at_ns))

    def _resume(self, answer_id: int) -> None:
        answer = self._answer
        resumed = now_ns()
        if answer is None or answer.answer_id != answer_id or not answer.resume(resumed):
            return
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
        await self._answers.stop(answer)
        if action.continues_as is not None:
            self._records.renumber(answer.record, action.continues_as)
        if action.ends_turn:
            answer.stats.update(speculations=action.speculations, speculations_dropped=action.dropped)
            self._end_turn(answer.record, answer, interrupted=True, stats=answer.stats)

    def _finish_answered(self, action: FinishTurn) -> None:
        answer = self._answer
        if answer is None or answer.answer_id != action.answer_id:
            return
        self._answer = None
        answer.stats.update(speculations=action.speculations, speculations_dropped=action.dropped)
        self._end_turn(answer.record, answer, interrupted=False, stats=answer.stats)

    def _end_turn(self, record: TurnRecord, answer: Answer | None, interrupted: bool,
                  stats: dict[str, float]) -> None:
        self._emit(self._records.end(record, answer, interrupted, stats))
        self._prepare_next_prompt()

    def _prepare_next_prompt(self) -> None:
        """Have the LM encode the next prompt's known part (the history it will see and the user header) while the
        user speaks, so the next answer's prefill encodes only the new words (`DiffusionChatModel.prepare`; a
        remote LM has no such step). A prepare still waiting when the next answer starts is dropped."""
        lm = self.engines.lm
        if not isinstance(lm, PreparesPrompts) or self._closed:
            return
        self._drop_prepared()
        self._prepared = threading.Event()
        try:
            lm.prepare(self._records.messages_with("")[:-1], self._prepared, conversation=self.id,
                       system_prompt=self.config.system_prompt)
        except ModelError as error:  # only a speed-up: the answer encodes its whole prompt instead
            log.warning("could not encode the next prompt ahead: %s", error)

    def _drop_prepared(self) -> None:
        if self._prepared is not None:
            self._prepared.set()
            self._prepared = None

    def _update_idle(self) -> None:
        """After every transition: whether the session is idle, and whether the core needs the clock."""
        if self.turn_taking.state is State.LISTENING and self._answer is None:
            self._idle.set()
        else:
            self._idle.clear()
        if not self._closed:
            self._clock.run_if_needed()

    def _emit(self, event: Event) -> None:
        if not isinstance(event, AudioOut):
            self.log.append(event)
        if not self._closed:
            self._out.put_nowait(event)
