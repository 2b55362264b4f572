"""One conversation: listen, understand, answer while refining, speak, and stop the instant the user interrupts.

The session is the async shell around its core (`voice.turn.session_core.SessionCore`: the turn-taking machine and
the turn detector's schedule, no I/O): it turns what the stages report into the core's events, and executes the
actions the core returns. It decides nothing itself.

    feed_audio -> ListenStage (VAD, endpointer, streaming ASR) -> _on_listen -> SessionCore.handle -> actions
    StartAnswer -> one answer task: LmRun (diffusion LM in a worker thread) -> drafts -> SpeakStage -> audio
    AskDetector -> Smart Turn in a thread -> DetectorAnswered -> SessionCore.handle -> actions
    every stage's events -> the session's event queue -> `events()` (the WebSocket server, the speaker, file mode)

An answer starts at a pause, before the end of turn is sure (an early answer); its events, audio included,
are held back until the core releases it, and vanish if the user goes on speaking. A cancelled answer's events are
dropped from the moment of the decision, so no audio ever follows its `Clear`. A sound during playback pauses the
outputs (`Pause`, then `Resume` or `Clear`); the answer's turn ends only once its audio has played, pauses excluded.

The core takes time as input: a clock task feeds it `ClockTick` (wall time, and how long the session has waited for
audio) every `CLOCK_TICK_S` while the user holds or contests the floor (an idle session does not tick), so a client
that stops sending audio still gets its turn ended, and a paused answer resumes when no word follows. The parts:
voice/turn/answer.py runs an answer, gates its events and acts on the outputs, voice/turn/clock.py is the clock,
voice/turn/detector_runs.py runs the turn detector in threads, voice/turn/records.py keeps each turn's record and ends
it into the history; this module wires them to the core.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from model.chat import ChatMessage
from voice.cancellation import cancel_and_wait
from voice.engines import Engines
from voice.errors import ProtocolError, VoiceError
from voice.events import AudioOut, ErrorEvent, Event, NoWords, SpeechEnd, SpeechStart, Transcript, VoiceResumed, now_ns
from voice.listen.stage import ListenStage
from voice.think.dialogue import Dialogue
from voice.tools.announcements import Announcements
from voice.tools.loop import ClientTools
from voice.tools.toolbox import check_client_tools, toolbox_for
from voice.turn.answer import Answer, AnswerGate, AnswerRunner
from voice.turn.clock import TurnClock
from voice.turn.config import SessionConfig
from voice.turn.detector_runs import DetectorRuns
from voice.turn.detector_schedule import AskDetector, AwaitVerdict, DetectorSchedule, DropVerdict
from voice.turn.machine_events import (
    AbandonTurn,
    AnswerAudio,
    AnswerFinished,
    AssistantAnnounces,
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
    UserDone,
    UserNoWords,
    UserResumed,
    UserSpeechStarted,
)
from voice.turn.records import TurnRecord, TurnRecords
from voice.turn.session_core import (
    FinalTranscript,
    LikelyFinalDecoding,
    MarkTurn,
    PartialTranscript,
    SessionAction,
    SessionClosed,
    SessionCore,
    SessionEvent,
    TextTyped,
    UserSpeechEnded,
)
from voice.turn.tuning import TurnTuning

log = logging.getLogger(__name__)


class HeldActions(NamedTuple):
    """Actions that wait for `wait`: what one of the core's actions takes time to finish (`Session._execute`)."""

    wait: Awaitable[None]
    rest: list[SessionAction]


class Session:
    """One conversation. Many sessions share one `Engines` in a process."""

    def __init__(self, engines: Engines, config: SessionConfig | None = None, session_id: str | None = None) -> None:
        self.engines = engines
        self.config = config = config or SessionConfig()
        self.id = session_id or uuid.uuid4().hex[:12]
        self.output_sample_rate = engines.tts.sample_rate
        self.dialogue = Dialogue(config.dialogue)
        self.log: deque[Event] = deque(maxlen=config.log_size)
        detector = engines.turn_detector
        schedule = None if detector is None else DetectorSchedule(detector.config.threshold,
                                                                  detector.config.max_seconds)
        self.core = SessionCore(config.turn_taking, schedule, config.full_duplex)
        self._detector = None if detector is None else DetectorRuns(detector, self._dispatch, f"turn-verdict-{self.id}")
        self._out: asyncio.Queue[Event | None] = asyncio.Queue()
        self._listen: ListenStage | None = None
        self._listen_lock = asyncio.Lock()  # the stage takes one call at a time: audio, flush (watchdog), close
        self._records = TurnRecords(self.id, self.dialogue)
        self.toolbox = toolbox_for(config.tools, engines.lm)
        self._announcements = Announcements(self._announce, f"timers-{self.id}")  # said once the floor is free
        self._answers = AnswerRunner(engines, config, self.id, self._emit, self._on_first_audio, self.toolbox,
                                     self._on_lm_end_of_turn)
        self._answer: Answer | None = None
        self._tuning = TurnTuning()
        self._tasks: set[asyncio.Task[None]] = set()  # answers, and actions held behind one that takes time
        self._clock = TurnClock(self.core, self._dispatch, name=f"turn-clock-{self.id}")
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    # --- public API ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._listen is None:
            self._listen = ListenStage(self.id, self._on_listen, self._tuning.listen(self.config.listen),
                                       model=self.engines.asr, on_likely_final=self._on_likely_final)
            self._prepare_next_prompt()
        self._start_tools()

    async def feed_audio(self, pcm16: bytes, sample_rate: int = 16000) -> None:
        """Microphone audio (PCM16 LE mono). Raises `AudioFormatError` for a bad frame; the session goes on."""
        if self._closed:
            raise ProtocolError("the session is closed")
        if self._listen is None:
            await self.start()
        if not self.core.accepts_audio:  # half duplex, and the answer plays
            self._clock.waiting_for_audio()
            return
        async with self._listen_lock:
            if self._listen is None:
                return
            self._clock.processing_audio()
            try:
                await self._listen.accept(pcm16, sample_rate)
            finally:
                self._clock.waiting_for_audio()
            await self._dispatch(Silence(self._listen.silence_ms))

    async def user_done(self) -> None:
        """The user's turn ends with the speech heard so far (a file's end, push-to-talk released)."""
        await self._dispatch(UserDone())

    async def end_of_audio(self) -> None:
        """The audio stream ended (a file's end, a cut-off utterance): close an open segment, end the turn there."""
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
        actions = self.core.handle(TextTyped(text, now_ns()))
        turn = self.core.turn_no
        await self._carry_out(actions)
        self._emit(Transcript(session=self.id, turn=turn, text=text, committed=text, final=True))

    @property
    def instructions(self) -> str:
        """The system prompt the next answer is written under."""
        return self._answers.options.system_prompt or ""

    def set_instructions(self, text: str | None) -> None:
        """Answers from now on follow `text` as their system prompt (None: the configured one again): what an OpenAI
        Realtime client sets as the session's instructions. The next prompt is encoded ahead again under it."""
        prompt = text if text is not None else self.config.generation.system_prompt
        self._answers.options = replace(self._answers.options, system_prompt=prompt)
        self._prepare_next_prompt()

    @property
    def turn_tuning(self) -> TurnTuning:
        """The listener's tuning in effect, every value filled in."""
        return self._tuning.filled(self.config.listen)

    def tune_turns(self, tuning: TurnTuning) -> None:
        """Listen and end turns by `tuning` over the configured settings from now on (a Realtime session's
        `turn_detection`). Raises ProtocolError for values the listener cannot take; then nothing changes."""
        try:
            listen, turn_taking = tuning.listen(self.config.listen), tuning.turn_taking(self.config.turn_taking)
        except ValueError as err:
            raise ProtocolError(f"turn detection: {err}") from None
        self._tuning = tuning
        self.core.retune(turn_taking)
        if self._listen is not None:
            self._listen.retune(listen)

    def set_client_tools(self, tools: ClientTools) -> None:
        """Offer the functions a client runs itself (a Realtime session's `tools`), and its `tool_choice`, to the
        answers from now on. A call of one ends its turn with a `ToolRequested`; the client's result comes back by
        `add_tool_result`. Raises ToolError (naming it) for a name the session's own tools use, or when the model
        cannot be held to tool calls; a refused offer changes nothing."""
        check_client_tools(tools, self.engines.lm, self.toolbox)
        self._answers.client_tools = tools
        self._prepare_next_prompt()

    def add_tool_result(self, call_id: str, output: str) -> None:
        """The result of a client's function call (`ToolRequested.call_id`): it joins the history as the tool message
        the call waits for (once the answer running now, if any, has ended), for the next answer to read. Raises
        ProtocolError for a call id no call is waiting under."""
        if self._answers.awaiting.pop(call_id, None) is None:
            raise ProtocolError(f"no function call {call_id} is waiting for its output")
        self._records.add_tool_result(output, answering=self._answer is not None)
        if self._answer is None:
            self._prepare_next_prompt()

    async def answer_tool_results(self) -> None:
        """Answer the tool results the client returned, with no new user words: a turn of its own, as a typed one
        is (it takes the floor from an answer in progress)."""
        if self._closed:
            raise ProtocolError("the session is closed")
        await self._dispatch(TextTyped("", now_ns(), continues=True))

    async def interrupt(self, reason: str = "interrupt") -> None:
        """Stop speaking now: `Clear`, cancel the turn; the history keeps what was played."""
        await self._dispatch(ClientInterrupt())

    def report_played(self, samples: int, turn: int | None = None) -> None:
        """The output says how many samples of the current answer were really played (speaker callback, or the
        browser's `played` message for `turn`; a report about another turn is stale and ignored)."""
        if self._answer is not None and (turn is None or turn == self._answer.turn):
            self._answer.playback.reported_played = samples

    def truncate_heard(self, turn: int, samples: int) -> str | None:
        """The listener heard only the first `samples` of `turn`'s answer: for the answer playing now, that is its
        played report; for the newest ended turn, its history message is cut to what those samples said (returned).
        None when `turn` is neither."""
        if self._answer is not None and self._answer.turn == turn:
            self.report_played(samples)
            return ""
        return self._records.truncate(turn, samples)

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
        self._answers.drop_prepared()
        answer, self._answer = self._answer, None
        if answer is not None:
            await self._answers.cancel(answer)
        await self._dispatch(SessionClosed())
        waits = self._detector.waits() if self._detector is not None else []
        await cancel_and_wait(*self._tasks, *waits, self._clock.task, self._announcements.task)
        if self.toolbox is not None:
            await self.toolbox.close()
        async with self._listen_lock:
            if self._listen is not None:
                await self._listen.aclose()
        self._out.put_nowait(None)

    # --- tools -----------------------------------------------------------------------------------------------------
    def _start_tools(self) -> None:
        """Once: start the MCP servers while the user speaks (the first answer does not wait for them), the timers."""
        if self.toolbox is None or self._announcements.task is not None:
            return
        self._announcements.start(self.toolbox.timers)
        self.toolbox.warm(f"tools-start-{self.id}")

    def _announce(self) -> None:
        """Say the next due timer's words if the floor is free; otherwise the core refuses them and they wait."""
        words = self._announcements.next
        if self._closed or words is None:
            return
        actions = self.core.handle(AssistantAnnounces(words))
        if actions:
            self._announcements.said()
            self._carry_out_soon(actions)

    # --- listening -------------------------------------------------------------------------------------------------
    async def _on_listen(self, event: Event) -> None:
        """The listener's events become the core's; they go out tagged with the turn the core says they belong to."""
        listen, core = self._listen, self.core
        if listen is None:  # only the listener calls this
            return
        match event:
            case SpeechStart():
                await self._dispatch(UserSpeechStarted(listen.speech_start_ms))
                self._emit(replace(event, turn=core.user_turn))
            case SpeechEnd(t_ns=t_ns, detected_ns=detected_ns):
                await self._dispatch(UserSpeechEnded(listen.speech_end_ms, t_ns, detected_ns))
                self._emit(replace(event, turn=core.user_turn))
            case VoiceResumed():
                self._emit(replace(event, turn=core.user_turn))
                await self._dispatch(UserResumed())
            case NoWords(through_ms=through_ms):
                await self._dispatch(UserNoWords(through_ms))
            case Transcript(final=False):
                self._emit(replace(event, turn=core.user_turn))
                await self._dispatch(PartialTranscript(event.text, event.likely_final, event.t_ns))
                if not event.likely_final:
                    self._prepare_words(event.committed)
            case Transcript():
                actions = core.handle(FinalTranscript(event.text, event.t_ns, listen.last_segment_audio))
                self._emit(replace(event, turn=core.user_turn))
                await self._carry_out(actions)

    def _on_likely_final(self, segment: np.ndarray, speech_end_ns: int | None = None) -> None:
        """The listener starts the segment's likely final decode; `segment` is the segment's audio if the user stays
        silent: the turn detector may judge it now (the core says whether)."""
        self._carry_out_soon(self.core.handle(LikelyFinalDecoding(segment, speech_end_ns)))

    async def _end_segment(self) -> None:
        """The client stopped sending audio mid-speech: close the open segment as the end of a stream would, and
        tell the core how much silence the audio held; the wall clock counts on from there."""
        async with self._listen_lock:
            if self._listen is None:
                return
            try:
                await self._listen.flush()
            except VoiceError as err:  # that segment's decode failed: the turn has no final, the session goes on
                self._emit(ErrorEvent(session=self.id, turn=self.core.user_turn, code=err.code, message=str(err)))
                return
            silence_ms = self._listen.silence_ms
        await self._dispatch(Silence(silence_ms))

    # --- executing the core's actions --------------------------------------------------------------------------------
    async def _dispatch(self, event: SessionEvent) -> None:
        await self._carry_out(self.core.handle(event))

    async def _carry_out(self, actions: list[SessionAction], after: Awaitable[None] | None = None) -> None:
        """Execute `actions` in order (once `after` is done), waiting for each one the next must wait for."""
        held = HeldActions(after, actions) if after is not None else self._execute(actions)
        while held is not None:
            await held.wait
            held = self._execute(held.rest)

    def _carry_out_soon(self, actions: list[SessionAction]) -> None:
        """From a synchronous callback (an answer's first audio or end, the likely final's decode, a due timer):
        execute `actions` now as far as nothing must be waited for; the rest follow in a task."""
        if (held := self._execute(actions)) is not None:
            self._spawn(self._carry_out(held.rest, after=held.wait), f"actions-{self.id}")

    def _execute(self, actions: list[SessionAction]) -> HeldActions | None:
        """The session's one executor: do each action in order. One that takes time the next must wait for (an
        answer's cancellation, a segment's end, a dropped verdict's wait) is returned with the actions after it."""
        for at, action in enumerate(actions):
            if (wait := self._execute_one(action)) is not None:
                return HeldActions(wait, actions[at + 1:])
        self._update_idle()
        return None

    def _execute_one(self, action: SessionAction) -> Awaitable[None] | None:
        match action:
            case CancelAnswer():
                return self._cancel_answer(action)
            case EndSegment():
                return self._end_segment()
            case DropVerdict(request=request) if self._detector is not None:
                dropped = self._detector.drop(request)
                return cancel_and_wait(dropped) if dropped is not None else None
            case StartAnswer():
                self._start_answer(action)
            case ReleaseAnswer(answer_id=answer_id):
                if (answer := self._current(answer_id)) is not None:
                    self._answers.release(answer)
            case FinishTurn(answer_id=answer_id, speculations=speculations, dropped=dropped):
                if (answer := self._current(answer_id)) is not None:
                    self._answer = None
                    self._end_answered(answer, speculations, dropped, interrupted=False)
            case AbandonTurn(turn=turn, text=text):
                record = self._records.get(turn)
                record.user_text = text
                self._end_turn(record, None, interrupted=True, stats={})
            case PauseOutput(answer_id=answer_id):
                if (answer := self._current(answer_id)) is not None:
                    self._answers.pause(answer)
            case ResumeOutput(answer_id=answer_id):
                if (answer := self._current(answer_id)) is not None:
                    self._answers.resume(answer)
            case MarkTurn(turn=turn, marks=marks, endpoint_detected_ns=detected):
                self._records.mark(turn, marks, detected)
            case AskDetector(request=request, audio=audio) if self._detector is not None:
                self._detector.ask(request, audio)
            case AwaitVerdict(request=request, turn=turn) if self._detector is not None:
                self._detector.await_verdict(request, turn)
        return None

    def _current(self, answer_id: int) -> Answer | None:
        """The answer running now, if it is answer `answer_id`."""
        return self._answer if self._answer is not None and self._answer.answer_id == answer_id else None

    def _start_answer(self, action: StartAnswer) -> None:
        self._answers.drop_prepared()
        self._start_tools()  # a typed turn may come before `start`
        record = self._records.get(action.turn)
        record.user_text = "" if action.announcement or action.continues else action.text
        answer = Answer(action.answer_id, record, AnswerGate(held=action.held), early=action.held,
                        announcement=action.text if action.announcement else None, continues=action.continues)
        self._answer = answer
        if action.announcement:
            messages: list[ChatMessage] = []
        else:
            messages = self._records.messages() if action.continues else self._records.messages_with(action.text)
        name = f"answer-{self.id}-{action.turn}-{action.answer_id}"
        answer.task = self._spawn(self._run_answer(answer, messages), name)

    async def _run_answer(self, answer: Answer, messages: list[ChatMessage]) -> None:
        await self._answers.run(answer, messages)
        if answer.gate.cancelled:
            return
        await answer.gate.released.wait()  # a failed answer still waits: its error belongs to a confirmed turn
        # synchronous from here: the core learns of the end and the turn ends, with no other step in between
        self._carry_out_soon(self.core.handle(AnswerFinished(answer.answer_id)))

    async def _on_lm_end_of_turn(self, answer: Answer, probability: float) -> None:
        """The answer's first pass read the LM's end-of-turn probability: the core weighs it with the detector's."""
        await self._dispatch(LmTurnVerdict(answer.answer_id, probability))

    def _on_first_audio(self, answer: Answer) -> None:
        self._carry_out_soon(self.core.handle(AnswerAudio(answer.answer_id)))

    async def _cancel_answer(self, action: CancelAnswer) -> None:
        if (answer := self._current(action.answer_id)) is None:
            return
        self._answer = None
        await self._answers.cancel(answer, clear_reason=action.reason if action.clear else None)
        if action.continues_as is not None:
            self._records.renumber(answer.record, action.continues_as)
        if action.ends_turn:
            self._end_answered(answer, action.speculations, action.dropped, interrupted=True)

    def _end_answered(self, answer: Answer, speculations: int, dropped: int, interrupted: bool) -> None:
        """`answer`'s turn ends (`FinishTurn`, or a `CancelAnswer` that ends it), its speculations counted."""
        answer.stats.update(speculations=speculations, speculations_dropped=dropped)
        self._end_turn(answer.record, answer, interrupted, stats=answer.stats)

    def _end_turn(self, record: TurnRecord, answer: Answer | None, interrupted: bool, stats: dict[str, float]) -> None:
        self._emit(self._records.end(record, answer, interrupted, stats))
        self._prepare_next_prompt()

    def _prepare_next_prompt(self, words: str = "") -> None:
        """The LM encodes what the next answer will see before the user's next words while the user speaks (and the
        `words` already committed of them)."""
        if not self._closed:
            self._answers.prepare_next(self._records.messages_with("")[:-1], words)

    def _prepare_words(self, committed: str) -> None:
        """Words the recogniser committed while the user speaks are the start of the next answer's message: the LM
        encodes them now, idle, not in the answer's first pass (~4.7 ms a token on one core of the 2-core machine)."""
        before = self.core.words_so_far
        if before is None or not committed.strip():
            return
        words = f"{before} {committed.strip()}".strip()
        if words != self._answers.prepared_words:
            self._prepare_next_prompt(words)

    def _update_idle(self) -> None:
        """After every transition: whether the session is idle, and whether the core needs the clock."""
        if self.core.idle:
            self._idle.set()
            if self._announcements.next is not None:  # said from the loop, not inside the transition that freed it
                asyncio.get_running_loop().call_soon(self._announce)
        else:
            self._idle.clear()
        if not self._closed:
            self._clock.run_if_needed()

    def _spawn(self, work: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _emit(self, event: Event) -> None:
        if not isinstance(event, AudioOut):
            self.log.append(event)
        if not self._closed:
            self._out.put_nowait(event)
