"""One conversation: listen, understand, answer while refining, speak, and stop the instant the user interrupts.

The session wires the stages together as asyncio tasks:

    feed_audio -> ListenStage (VAD, endpointer, streaming ASR) -> _on_listen
    final transcript -> turn task (one TaskGroup): LmRun (diffusion LM in a worker thread) -> drafts -> SpeakStage
    every stage's events -> the session's event queue -> `events()` (the WebSocket server, the speaker, file mode)

Turn-taking rules live here: a turn starts at the final transcript (or a typed message); with early LM start the model
already began on the committed transcript while the endpointer was waiting out its silence, and that work is kept
when the final transcript matches. User speech while the assistant is speaking is a barge-in: the turn is cancelled,
a `Clear` tells the output to stop at once, and the history keeps only the phrases whose audio was played.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

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
    PhraseCommitted,
    SpeechEnd,
    SpeechStart,
    Transcript,
    TtsFirstChunk,
    TurnEnd,
    now_ns,
)
from voice.latency import breakdown
from voice.listen.stage import ListenConfig, ListenStage
from voice.listen.words import same_words
from voice.speak.playback_ledger import PlaybackLedger
from voice.speak.speculator import SpeculatorConfig
from voice.speak.stage import SpeakStage
from voice.think.dialogue import Dialogue, DialogueConfig
from voice.think.lm_run import LmRun

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionConfig:
    listen: ListenConfig = field(default_factory=ListenConfig)
    speculator: SpeculatorConfig = field(default_factory=SpeculatorConfig)
    dialogue: DialogueConfig = field(default_factory=DialogueConfig)
    generation: GenerationOptions = field(default_factory=lambda: GenerationOptions(max_new_tokens=64))
    early_lm: bool = True  # start the LM on the trailing-silence transcript before the endpointer's final decision
    full_duplex: bool = True  # False (half duplex): microphone audio is ignored while the assistant speaks
    max_turn_seconds: float = 60.0
    # A turn ends when its audio has had time to play, not when the last chunk was handed out: a user who speaks
    # while the listener still hears the answer is barging in. File mode has no listener and turns this off.
    wait_for_playback: bool = True
    max_text_chars: int = 2000
    log_size: int = 5000  # events kept in `Session.log` (audio chunks excluded)


@dataclass(slots=True)
class _Turn:
    turn: int
    user_text: str
    marks: dict[str, int] = field(default_factory=dict)
    endpoint_detected_ns: int | None = None
    ledger: PlaybackLedger = field(default_factory=PlaybackLedger)
    sample_rate: int = 0
    first_audio_ns: int | None = None
    reported_played: int | None = None  # exact playback position from the output, when it reports one
    answer: str = ""
    stats: dict[str, float] = field(default_factory=dict)
    ended: bool = False  # its TurnEnd was emitted
    run: LmRun | None = None  # the answer's generation, once started (or adopted from the early start)


class Session:
    """One conversation. Many sessions share one `Engines` in a process."""

    def __init__(self, engines: Engines, config: SessionConfig | None = None, session_id: str | None = None) -> None:
        self.engines = engines
        self.config = config or SessionConfig()
        self.id = session_id or uuid.uuid4().hex[:12]
        self.output_sample_rate = engines.tts.sample_rate
        self.dialogue = Dialogue(self.config.dialogue)
        self.log: deque[Event] = deque(maxlen=self.config.log_size)
        self._out: asyncio.Queue[Event | None] = asyncio.Queue()
        self._listen: ListenStage | None = None
        self._turn_no = 0
        self._listening_turn: _Turn | None = None  # the user turn being spoken right now
        self._turn_task: asyncio.Task[None] | None = None
        self._task_turn: _Turn | None = None
        self._early: tuple[str, LmRun] | None = None
        self._speaking = False
        self._closed = False

    # --- public API ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._listen = ListenStage(self.id, self._on_listen, self.config.listen, model=self.engines.asr)

    async def feed_audio(self, pcm16: bytes, sample_rate: int = 16000) -> None:
        """Microphone audio (PCM16 LE mono). Raises `AudioFormatError` for a bad frame; the session goes on."""
        if self._closed:
            raise ProtocolError("the session is closed")
        if self._listen is None:
            await self.start()
        if self._speaking and not self.config.full_duplex:
            return  # half duplex: the assistant must not hear (and interrupt) itself through open speakers
        if self._listen is not None:
            await self._listen.accept(pcm16, sample_rate)

    async def end_of_audio(self) -> None:
        """The audio stream ended (end of a file): close a turn still open and wait for its final transcript."""
        if self._listen is not None:
            await self._listen.flush()

    async def send_text(self, text: str) -> None:
        """A typed user turn; interrupts an answer in progress."""
        text = text.strip()
        if not text:
            raise ProtocolError("the text turn is empty")
        if len(text) > self.config.max_text_chars:
            raise ProtocolError(f"the text turn is longer than {self.config.max_text_chars} characters")
        await self.interrupt("new_text")
        self._turn_no += 1
        turn = _Turn(self._turn_no, text)
        turn.marks["text_in"] = now_ns()
        await self._emit(Transcript(session=self.id, turn=turn.turn, text=text, committed=text, final=True))
        self._begin_answer(turn, None)

    async def interrupt(self, reason: str = "interrupt") -> None:
        """Stop speaking now: `Clear`, cancel the turn; the history keeps what was played."""
        await self._cancel_turn(reason)

    def report_played(self, samples: int) -> None:
        """The output says how many samples of the current answer were really played (speaker callback)."""
        if (turn := self._answering()) is not None:
            turn.reported_played = samples

    async def wait_idle(self) -> None:
        """Wait until no answer is in progress (file mode and tests)."""
        while self._turn_task is not None and not self._turn_task.done():
            await asyncio.wait({self._turn_task})

    async def events(self) -> AsyncIterator[Event]:
        while (event := await self._out.get()) is not None:
            yield event

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._turn_task)
        await self._drop_early()
        if self._listen is not None:
            await self._listen.aclose()
        self._out.put_nowait(None)

    # --- listening -------------------------------------------------------------------------------------------------
    async def _on_listen(self, event: Event) -> None:
        if isinstance(event, SpeechStart):
            await self._user_started(event)
            return
        turn = self._listening_turn
        if turn is None:  # a decode finishing after its turn was abandoned
            return
        event = replace(event, turn=turn.turn)
        if isinstance(event, SpeechEnd):
            turn.marks["speech_end"] = event.t_ns
            turn.endpoint_detected_ns = event.detected_ns
            await self._emit(event)
        elif isinstance(event, Transcript) and not event.final:
            await self._emit(event)
            # Only in the trailing silence: the decode made there is the one the final transcript reuses, so the
            # words rarely change; starting on mid-speech partials would waste the CPU the recogniser needs.
            if self.config.early_lm and event.text.strip() and self._listen and self._listen.in_trailing_silence:
                await self._start_early(event.text)
        elif isinstance(event, Transcript):
            turn.marks["asr_final"] = event.t_ns
            self._listening_turn = None
            await self._emit(event)
            if not event.text.strip():
                await self._drop_early()  # noise that looked like speech: no words, no turn
                return
            turn.user_text = event.text.strip()
            early = await self._take_early(turn.user_text)
            self._begin_answer(turn, early)

    async def _user_started(self, event: SpeechStart) -> None:
        await self._cancel_turn("barge_in")  # before any audio this just means the user kept talking
        await self._drop_early()
        self._turn_no += 1
        self._listening_turn = _Turn(self._turn_no, "")
        await self._emit(replace(event, turn=self._turn_no))

    async def _start_early(self, text: str) -> None:
        if self._early is not None and same_words(self._early[0], text):
            return
        await self._drop_early()
        messages = self._messages_with(text)
        run = LmRun(self.engines.lm, messages, self.config.generation, name=f"lm-early-{self.id}-{self._turn_no}")
        self._early = (text, run)

    async def _take_early(self, final_text: str) -> LmRun | None:
        """The early run, if it answered the words that were finally said; otherwise stop it (it holds the model)."""
        if self._early is None:
            return None
        text, run = self._early
        self._early = None
        if same_words(text, final_text):
            return run
        await run.close()
        return None

    async def _drop_early(self) -> None:
        if self._early is not None:
            _, run = self._early
            self._early = None
            await run.close()

    def _messages_with(self, user_text: str) -> list[ChatMessage]:
        probe = Dialogue(self.dialogue.config)
        for message in self.dialogue.history:
            (probe.add_user if message.role == "user" else probe.add_assistant)(message.content)
        probe.add_user(user_text)
        return probe.messages()

    # --- answering -------------------------------------------------------------------------------------------------
    def _begin_answer(self, turn: _Turn, early: LmRun | None) -> None:
        self._task_turn = turn
        turn.run = early
        self.dialogue.add_user(turn.user_text)
        self._turn_task = asyncio.create_task(self._run_turn(turn, early), name=f"turn-{self.id}-{turn.turn}")

    async def _cancel_turn(self, reason: str) -> None:
        """Cancel the answer in progress; its TurnEnd is emitted even if the task was cancelled before it ran."""
        task, turn = self._turn_task, self._task_turn
        if task is None or task.done():
            return
        if self._speaking:
            await self._emit(Clear(session=self.id, turn=self._current_turn(), reason=reason))
        await cancel_and_wait(task)
        if turn is not None and not turn.ended:
            if turn.run is not None:
                await turn.run.close()
            await self._finish_turn(turn, interrupted=True)

    async def _run_turn(self, turn: _Turn, early: LmRun | None) -> None:
        run = early
        if run is None:
            run = LmRun(self.engines.lm, self.dialogue.messages(), self.config.generation, f"lm-{self.id}-{turn.turn}")
            turn.run = run
        turn.stats["early_lm"] = 1.0 if early is not None else 0.0
        await self._emit(LmStarted(session=self.id, turn=turn.turn, t_ns=run.started_ns, early=early is not None))
        interrupted = False
        try:
            async with asyncio.timeout(self.config.max_turn_seconds):
                await self._answer(turn, run)
            if self.config.wait_for_playback:
                await asyncio.sleep(self._playback_left(turn))
        except asyncio.CancelledError:
            interrupted = True
            await self._finish_turn(turn, interrupted=True)
            raise
        except TimeoutError:
            await self._emit_error(turn, "turn_timeout", f"the turn took longer than {self.config.max_turn_seconds} s")
        except (ModelError, VoiceError) as err:
            await self._emit_error(turn, getattr(err, "code", "model_error"), str(err))
        except Exception as err:  # the turn boundary: a bug in one stage ends this turn, never the session
            log.exception("turn %s failed", turn.turn)
            await self._emit_error(turn, "internal_error", f"{type(err).__name__}: {err}")
        finally:
            await run.close()
            self._speaking = False
        if not interrupted:
            await self._finish_turn(turn, interrupted=False)

    async def _answer(self, turn: _Turn, run: LmRun) -> None:
        drafts: asyncio.Queue[Draft | None] = asyncio.Queue(maxsize=256)
        speaker = SpeakStage(
            self.engines.tts,
            lambda event: self._on_speech(turn, event),
            session=self.id,
            turn=turn.turn,
            config=self.config.speculator,
            ledger=turn.ledger,
        )
        turn.sample_rate = speaker.sample_rate
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pump(turn, run, drafts), name=f"lm-pump-{self.id}-{turn.turn}")
                report = await speaker.run(drafts)
        except BaseExceptionGroup as failures:
            # One failing stage (the model, the voice) ends the turn with its own typed error, not a group.
            first = next((e for e in failures.exceptions if isinstance(e, Exception)), None)
            if first is None:
                raise
            raise first from None
        turn.stats.update(
            hits=report.hits,
            misses=report.misses,
            speculation_none=report.nones,
            saved_ms=report.saved_ms,
            wasted_ms=report.wasted_ms,
            wasted_cpu_ms=report.wasted_cpu_ms,
        )

    async def _pump(self, turn: _Turn, run: LmRun, drafts: asyncio.Queue[Draft | None]) -> None:
        first = True
        passes = 0
        lm_seconds = 0.0
        try:
            async for t_ns, draft in run.drafts():
                passes += 1
                lm_seconds += draft.elapsed_s
                if first:
                    first = False
                    turn.marks["lm_first_pass"] = t_ns
                    await self._emit(LmFirstPass(session=self.id, turn=turn.turn, t_ns=t_ns))
                await self._emit(
                    DraftUpdate(
                        session=self.id,
                        turn=turn.turn,
                        step=draft.step,
                        committed=draft.committed_text,
                        draft=draft.text,
                        pieces=tuple((piece.text, piece.committed) for piece in draft.pieces),
                    )
                )
                await drafts.put(draft)
                if draft.done:
                    turn.answer = draft.committed_text.strip() or draft.text.strip()
                    tokens = draft.completion_tokens
                    # the end-of-sequence token is generated work too (as in scripts/eval_default_model.py)
                    generated = tokens + (1 if draft.finish_reason == "stop" else 0)
                    turn.stats.update(
                        tokens=tokens,
                        passes=passes,
                        tokens_per_pass=generated / passes if passes else 0.0,
                        lm_seconds=lm_seconds,
                        tokens_per_second=generated / lm_seconds if lm_seconds > 0 else 0.0,
                        prompt_tokens=draft.prompt_tokens,
                        prompt_tokens_encoded=draft.prompt_tokens - draft.cached_prompt_tokens,
                    )
                    await self._emit(
                        AnswerDone(
                            session=self.id,
                            turn=turn.turn,
                            text=turn.answer,
                            tokens=tokens,
                            passes=passes,
                            lm_seconds=lm_seconds,
                            finish_reason=draft.finish_reason or "stop",
                        )
                    )
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                drafts.put_nowait(None)

    async def _on_speech(self, turn: _Turn, event: Event) -> None:
        if isinstance(event, PhraseCommitted) and "first_phrase_committed" not in turn.marks:
            turn.marks["first_phrase_committed"] = event.t_ns
        elif isinstance(event, TtsFirstChunk):
            turn.marks.setdefault("tts_first_chunk", event.t_ns)
        elif isinstance(event, AudioOut) and turn.first_audio_ns is None:
            self._speaking = True
            turn.first_audio_ns = now_ns()
            turn.marks["first_audio_out"] = turn.first_audio_ns
            await self._emit(FirstAudioOut(session=self.id, turn=turn.turn, t_ns=turn.first_audio_ns))
        await self._emit(event)

    async def _finish_turn(self, turn: _Turn, interrupted: bool) -> None:
        if turn.ended:
            return
        turn.ended = True
        if interrupted:
            turn.ledger.played_total(self._played_estimate(turn))
            spoken = turn.ledger.spoken_text()
        else:
            spoken = turn.answer
        self.dialogue.add_assistant(spoken)
        await self._emit(
            TurnEnd(
                session=self.id,
                turn=turn.turn,
                user_text=turn.user_text,
                answer=turn.answer,
                spoken=spoken,
                interrupted=interrupted,
                latency_ms=breakdown(turn.marks, turn.endpoint_detected_ns),
                stats=dict(turn.stats),
            )
        )

    def _playback_left(self, turn: _Turn) -> float:
        """Seconds until the audio handed out so far has played, assuming playback started with the first chunk."""
        if turn.first_audio_ns is None or not turn.sample_rate:
            return 0.0
        played = self._played_estimate(turn)
        return max(0.0, (turn.ledger.samples_out() - played) / turn.sample_rate)

    def _played_estimate(self, turn: _Turn) -> int:
        """Samples the listener heard: the output's own report, else real time since the first sample went out."""
        if turn.reported_played is not None:
            return turn.reported_played
        if turn.first_audio_ns is None or not turn.sample_rate:
            return 0
        return int((now_ns() - turn.first_audio_ns) * turn.sample_rate / 1e9)

    async def _emit_error(self, turn: _Turn, code: str, message: str) -> None:
        await self._emit(ErrorEvent(session=self.id, turn=turn.turn, code=code, message=message))

    def _current_turn(self) -> int:
        turn = self._answering()
        return turn.turn if turn is not None else self._turn_no

    def _answering(self) -> _Turn | None:
        """The turn whose answer is in progress, if any."""
        task = self._turn_task
        return self._task_turn if task is not None and not task.done() else None

    async def _emit(self, event: Event) -> None:
        if not isinstance(event, AudioOut):
            self.log.append(event)
        if not self._closed:
            self._out.put_nowait(event)
