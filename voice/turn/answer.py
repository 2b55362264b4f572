"""One answer: the LM's drafts spoken by the SpeakStage, its events gated, its playback position kept.

`Answer` is one answer's state, in parts that change together: its gate (`AnswerGate`: its events held, for an early
answer before the end of turn is confirmed, or dropped once cancelled), the LM's work (`LmUsage`), its latency marks,
and its playback (voice/turn/answer_playback.py: how much of its audio has played, pauses excluded).
`AnswerRunner` runs it: LmRun (the diffusion LM in a worker thread) -> drafts -> SpeakStage -> audio, every event
through one gate, and then waits until the audio has had time to play; it pauses, resumes and cancels the outputs
(`Pause`, `Resume`, `Clear`), and has the LM encode the next prompt ahead. What the answer means for the turn
(release, pause, cancel, finish) is decided by the session core (voice/turn/session_core.py) and executed by the
session (voice/turn/session.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from model.chat import ChatMessage, Draft, DraftPiece, GenerationOptions, PreparesPrompts, StandsAside
from model.chat.tools import Function, ToolCall, opens_calls, starts_calls
from model.errors import ModelError
from voice.cancellation import cancel_and_wait
from voice.engines import Engines
from voice.errors import ToolError, VoiceError
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
    ToolCalled,
    ToolRequested,
    TtsFirstChunk,
    now_ns,
)
from voice.speak.stage import FIRST_AUDIO_HOLD_S, SpeakStage
from voice.think.lm_run import LmRun
from voice.tools.loop import Apologise, ClientTools, HandOut, RunTools, ToolLoop, offered_options
from voice.tools.toolbox import Toolbox, ToolsConfig
from voice.turn.answer_playback import AnswerPlayback
from voice.turn.config import SessionConfig
from voice.turn.record import TurnRecord

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AnswerGate:
    """Whether an answer's events go out: held (an early answer, until the end of turn is confirmed), then open; or
    shut for good once the answer is cancelled."""

    held: bool
    held_events: list[Event] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)  # set once open: waits for the end of turn
    cancelled: bool = False

    def __post_init__(self) -> None:
        if not self.held:
            self.released.set()

    def admit(self, event: Event) -> bool:
        """Whether `event` goes out now; a held one is kept for `open`, a cancelled answer's dropped."""
        if self.cancelled:
            return False
        if self.held:
            self.held_events.append(event)
            return False
        return True

    def open(self) -> list[Event]:
        """Let everything through from now on; returns what was held, in order."""
        self.held = False
        held, self.held_events = self.held_events, []
        self.released.set()
        return held


@dataclass(slots=True)
class LmUsage:
    """The LM's work for one answer, over every round of its tool loop."""

    passes: int = 0
    seconds: float = 0.0
    tokens: int = 0  # written
    prompt_tokens: int = 0  # read ...
    cached_prompt_tokens: int = 0  # ... of which its cache held these

    def count(self, draft: Draft) -> None:
        self.passes += 1
        self.seconds += draft.elapsed_s
        if draft.done:
            self.tokens += draft.completion_tokens
            self.prompt_tokens += draft.prompt_tokens
            self.cached_prompt_tokens += draft.cached_prompt_tokens


@dataclass(slots=True)
class Answer:
    """One answer being generated and spoken: what it answers (fixed at its start), what runs it, the gate its events
    pass (`AnswerRunner.event`), the LM's work, and what it has said and played so far."""

    answer_id: int
    record: TurnRecord
    gate: AnswerGate
    early: bool  # started before the end of turn was confirmed
    announcement: str | None = None  # words to say instead of asking the model (a timer that is due)
    continues: bool = False  # it answers tool results a client returned, with no new user words
    task: asyncio.Task[None] | None = None
    run: LmRun | None = None
    usage: LmUsage = field(default_factory=LmUsage)
    marks: dict[str, int] = field(default_factory=dict)
    playback: AnswerPlayback = field(default_factory=AnswerPlayback)  # how much of its audio has played
    text: str = ""  # what it says so far: its committed text (or its draft, before any commit)
    said: tuple[DraftPiece, ...] = ()  # words said before the model's final round (the filler while a tool runs)
    tool_messages: list[ChatMessage] = field(default_factory=list)  # the turn's tool calls and results
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def turn(self) -> int:
        return self.record.turn


def session_options(config: SessionConfig, session_id: str) -> GenerationOptions:
    """Every answer of a session: the configured options, its own cache slot, and someone waiting to hear it (a model
    that batches starts it ahead of bulk API work)."""
    return dataclasses.replace(config.generation, conversation=session_id, interactive=True)


class AnswerRunner:
    """Runs a session's answers: `run` generates and speaks one; `event` and `release` gate what goes out; `pause`,
    `resume` and `cancel` act on its outputs; `prepare_next` encodes the next prompt ahead.

    `emit` puts an event on the session's output; `on_first_audio` tells the session that an answer's first audio
    went out (it is speaking now); `toolbox`: the session's tools (None: the model is offered none of its own);
    `client_tools`: the functions a client runs itself, and the choice over all tools. A call of a client's function
    ends its turn unanswered; `awaiting` keeps those calls (call id -> name) until their results come back."""

    MAX_AWAITING = 32  # calls a client never answered are forgotten, oldest first

    def __init__(
        self,
        engines: Engines,
        config: SessionConfig,
        session_id: str,
        emit: Callable[[Event], None],
        on_first_audio: Callable[[Answer], None],
        toolbox: Toolbox | None = None,
        on_end_of_turn: Callable[[Answer, float], Awaitable[None]] | None = None,
    ) -> None:
        self.engines = engines
        self.toolbox = toolbox
        self.config = config
        self.session_id = session_id
        self._emit = emit
        self._on_first_audio = on_first_audio
        # Told the LM's end-of-turn probability as soon as the first pass gives it (not held like the answer's
        # events: the end of turn waits on it)
        self.on_end_of_turn = on_end_of_turn
        self._prepared: threading.Event | None = None  # cancels the next prompt's encoding ahead, while it waits
        self.prepared_words = ""  # the user's words the last prepare encoded ahead
        self.options = session_options(config, session_id)
        self.client_tools = ClientTools()
        self.awaiting: dict[str, str] = {}

    async def run(self, answer: Answer, messages: list[ChatMessage]) -> None:
        """Generate and speak `answer`, wait for its release and its playback; a failure or the turn's time limit
        becomes the answer's `ErrorEvent`. Returns early only when cancelled."""
        answer.stats["early_lm"] = 1.0 if answer.early else 0.0
        self.event(answer, LmStarted(session=self.session_id, turn=answer.turn, t_ns=now_ns(), early=answer.early))
        try:
            async with asyncio.timeout(self.config.max_turn_seconds):
                await self._answer_body(answer, messages)
            await answer.gate.released.wait()  # an answer ready before its end of turn was confirmed waits for it
            await self._until_played(answer)
        except TimeoutError:
            self._error(answer, "turn_timeout", f"the turn took longer than {self.config.max_turn_seconds} s")
        except (ModelError, VoiceError) as err:
            self._error(answer, err.code, str(err))
        except Exception as err:  # the turn boundary: a bug in one stage ends this turn, never the session
            log.exception("turn %s failed", answer.turn)
            self._error(answer, "internal_error", f"{type(err).__name__}: {err}")
        finally:
            if answer.run is not None:
                await answer.run.close()

    async def cancel(self, answer: Answer, clear_reason: str | None = None) -> None:
        """Drop everything of `answer` from now on, so no audio follows its `Clear` (sent when `clear_reason` is
        given); then cancel its task and close its LM run (the worker thread stops at its next pass)."""
        answer.gate.cancelled = True
        if clear_reason is not None:
            self._emit(Clear(session=self.session_id, turn=answer.turn, reason=clear_reason))
        await cancel_and_wait(answer.task)
        if answer.run is not None:
            await answer.run.close()

    def pause(self, answer: Answer) -> None:
        """The outputs stop playing `answer` (`Pause`), unless they already had."""
        if answer.playback.pause(now_ns()):
            self._emit(Pause(session=self.session_id, turn=answer.turn, t_ns=answer.playback.paused_at_ns))

    def resume(self, answer: Answer) -> None:
        """The outputs play `answer` on from where they paused (`Resume`), if they had paused."""
        resumed = now_ns()
        if answer.playback.resume(resumed):
            self._emit(Resume(session=self.session_id, turn=answer.turn, t_ns=resumed))

    def prepare_next(self, history: list[ChatMessage], words: str = "") -> None:
        """Have the LM encode the next prompt's known part (`history`, the messages it will see before the user's
        next words, the user header and the `words` the user is known to have begun with) while the user speaks, so
        the next answer's first pass encodes only the rest (`DiffusionChatModel.prepare`; a remote LM has no such
        step). A prepare still waiting when the next answer starts is dropped (`drop_prepared`)."""
        self.prepared_words = words
        lm = self.engines.lm
        if not isinstance(lm, PreparesPrompts):
            return
        self.drop_prepared()
        self._prepared = threading.Event()
        try:
            offered = self._offered(self.toolbox.offered if self.toolbox is not None else ())
            lm.prepare(history, self._prepared, conversation=self.session_id,
                       system_prompt=offered_options(self.options, offered).system_prompt, words=words)
        except ModelError as error:  # only a speed-up: the answer encodes its whole prompt instead
            log.warning("could not encode the next prompt ahead: %s", error)

    def _offered(self, own: Sequence[Function]) -> tuple[Function, ...]:
        """Every function an answer is offered: the session's own, then the client's (a name the session's own tools
        already use stays theirs: the client's update was refused for it, unless an MCP server has offered it
        since)."""
        names = {function.name for function in own}
        clients = tuple(f for f in self.client_tools.functions if f.name not in names)
        if len(clients) < len(self.client_tools.functions):
            log.warning("a client tool's name is now one of the session's own tools; the session's is offered")
        return (*own, *clients)

    def drop_prepared(self) -> None:
        if self._prepared is not None:
            self._prepared.set()
            self._prepared = None

    async def _until_played(self, answer: Answer) -> None:
        """Wait until the answer's audio has had time to play (no wait without `wait_for_playback`); a pause, even
        one that begins during the wait, moves that moment later."""
        while True:
            await answer.playback.unpaused.wait()
            pauses = answer.playback.pauses
            left = answer.playback.playback_left() if self.config.wait_for_playback else 0.0
            if left > 0:
                await asyncio.sleep(left)
            if answer.playback.pauses == pauses and answer.playback.unpaused.is_set():
                return

    async def _answer_body(self, answer: Answer, messages: list[ChatMessage]) -> None:
        drafts: asyncio.Queue[Draft | None] = asyncio.Queue(maxsize=256)
        speaker = SpeakStage(
            self.engines.tts,
            lambda event: self._on_speech(answer, event),
            session=self.session_id,
            turn=answer.turn,
            config=self.config.speculator,
            ledger=answer.playback.ledger,
            first_audio_hold=self._first_audio_hold(),
        )
        answer.playback.sample_rate = speaker.sample_rate
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._think(answer, messages, drafts),
                                  name=f"lm-pump-{self.session_id}-{answer.turn}")
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

    def _first_audio_hold(self) -> Callable[[], AbstractContextManager[None]] | None:
        """What the speaker holds while the first phrase is synthesised: the local model's passes standing aside."""
        lm = self.engines.lm
        if not isinstance(lm, StandsAside):
            return None
        return lambda: lm.standing_aside(FIRST_AUDIO_HOLD_S)

    async def _think(self, answer: Answer, messages: list[ChatMessage], drafts: asyncio.Queue[Draft | None]) -> None:
        """The answer's words, through the tool loop (voice/tools/loop.py): each round is one LM answer; a round of
        tool calls is run here and never spoken, and the model answers again with the results. What the speaker
        hears is one growing answer: the filler said while a tool ran, then the final round's words."""
        try:
            if answer.announcement is not None:  # a timer's words: no model involved
                await self._say(answer, drafts, answer.announcement)
                return
            toolbox = self.toolbox
            functions = self._offered(await toolbox.functions() if toolbox is not None else ())
            own = {function.name for function in toolbox.offered} if toolbox is not None else set()
            loop = ToolLoop(messages, functions, self.options, (self.config.tools or ToolsConfig()).max_rounds,
                            external={f.name for f in functions if f.name not in own},
                            choice=self.client_tools.choice)
            while True:
                if answer.run is not None:
                    await answer.run.close()
                name = f"lm-{self.session_id}-{answer.turn}" + (f"-{loop.rounds}" if loop.rounds else "")
                answer.run = LmRun(self.engines.lm, loop.messages, loop.options(), name)
                decision = loop.answered(await self._pump(answer, answer.run, drafts))
                if isinstance(decision, RunTools):
                    decision = loop.results(decision.calls, await self._run_tools(answer, decision.calls, drafts))
                    answer.tool_messages = list(loop.added)
                    if decision is None:
                        continue
                if isinstance(decision, HandOut):
                    await self._hand_out(answer, loop, decision)
                    return
                if isinstance(decision, Apologise):
                    await self._say(answer, drafts, decision.text)
                return
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                drafts.put_nowait(None)

    async def _pump(self, answer: Answer, run: LmRun, drafts: asyncio.Queue[Draft | None]) -> str:
        """One round: the LM's drafts to the speaker and the client, unless they are tool calls; returns the
        round's text once done (calls or words)."""
        session = self.session_id
        async for t_ns, draft in run.drafts():
            answer.usage.count(draft)
            if "lm_first_pass" not in answer.marks:
                answer.marks["lm_first_pass"] = t_ns
                self.event(answer, LmFirstPass(session=session, turn=answer.turn, t_ns=t_ns))
                if draft.end_of_turn is not None:
                    # the turn's record (TurnEnd.stats) keeps what the end-of-turn rule weighed: known only here
                    answer.stats["lm_end_of_turn"] = draft.end_of_turn
                    if self.on_end_of_turn is not None:
                        await self.on_end_of_turn(answer, draft.end_of_turn)
            # a tool call is never spoken nor shown, nor is a draft that may still become one; a finished answer is
            # a call only if it opens with a call's trigger
            if starts_calls(draft.text) if draft.done else opens_calls(draft.text):
                if draft.done:
                    return draft.text
                continue
            shown = dataclasses.replace(draft, pieces=answer.said + draft.pieces) if answer.said else draft
            self.event(
                answer,
                DraftUpdate(
                    session=session,
                    turn=answer.turn,
                    step=draft.step,
                    committed=shown.committed_text,
                    draft=shown.text,
                    pieces=tuple((piece.text, piece.committed) for piece in shown.pieces),
                ),
            )
            await drafts.put(shown)
            if draft.done:
                answer.text = draft.committed_text.strip() or draft.text.strip()
                tokens = draft.completion_tokens
                # the end-of-sequence token is generated work too (as in scripts/train/eval_default_model.py)
                generated = tokens + (1 if draft.finish_reason == "stop" else 0)
                passes, lm_seconds = answer.usage.passes, answer.usage.seconds
                answer.stats.update(
                    tokens=tokens,
                    passes=passes,
                    tokens_per_pass=generated / passes if passes else 0.0,
                    lm_seconds=lm_seconds,
                    tokens_per_second=generated / lm_seconds if lm_seconds > 0 else 0.0,
                    prompt_tokens=draft.prompt_tokens,
                    prompt_tokens_encoded=draft.prompt_tokens - draft.cached_prompt_tokens,
                )
                self._answer_done(answer, draft.finish_reason or "stop")
                return draft.text
        return ""  # cancelled: the stream ended without a done draft

    async def _hand_out(self, answer: Answer, loop: ToolLoop, decision: HandOut) -> None:
        """Calls of a client's functions: they go out (once the turn is confirmed, as a tool's run waits) and the
        answer ends with them and no words; the history keeps them, and `awaiting` their ids."""
        await answer.gate.released.wait()
        loop.handed_out(decision)
        answer.tool_messages = list(loop.added)
        for call, call_id in zip(decision.calls, decision.call_ids, strict=True):
            self.awaiting[call_id] = call.name
            while len(self.awaiting) > self.MAX_AWAITING:
                del self.awaiting[next(iter(self.awaiting))]
            self.event(answer, ToolRequested(session=self.session_id, turn=answer.turn, name=call.name,
                                             arguments=call.arguments, call_id=call_id))
        self._answer_done(answer, "tool_calls")

    async def _run_tools(self, answer: Answer, calls: Sequence[ToolCall],
                         drafts: asyncio.Queue[Draft | None]) -> list[str | ToolError]:
        """Run a round's calls one after the other; a filler is said once the round takes longer than
        `filler_after_s` (said once a turn). An early answer's calls wait for its end of turn: a tool acts (a timer
        is set), and an answer the user talks over is dropped, so it must not have acted."""
        toolbox = self.toolbox
        if toolbox is None:
            raise RuntimeError("an answer offered no tools made tool calls")
        await answer.gate.released.wait()
        task = asyncio.create_task(self._call_all(toolbox, answer, calls),
                                   name=f"tools-{self.session_id}-{answer.turn}")
        try:
            done, _ = await asyncio.wait({task}, timeout=toolbox.config.filler_after_s)
            if not done and not answer.said:
                answer.said = (DraftPiece(f"{toolbox.config.filler} ", committed=True),)
                await drafts.put(Draft(step=0, pieces=answer.said))
            return await task
        finally:
            await cancel_and_wait(task)

    async def _call_all(self, toolbox: Toolbox, answer: Answer, calls: Sequence[ToolCall]) -> list[str | ToolError]:
        outcomes: list[str | ToolError] = []
        for call in calls:
            started = now_ns()
            try:
                outcome: str | ToolError = await toolbox.call(call.name, call.arguments)
            except ToolError as error:
                outcome = error
            except Exception:  # a tool's bug is that tool's failure: the turn apologises and goes on
                log.exception("tool %s failed", call.name)
                outcome = ToolError(f"the {call.name} tool failed")
            outcomes.append(outcome)
            answer.stats["tool_calls"] = answer.stats.get("tool_calls", 0.0) + 1
            self.event(answer, ToolCalled(
                session=self.session_id, turn=answer.turn, name=call.name, arguments=call.arguments,
                result=outcome if isinstance(outcome, str) else "", error=str(outcome) if isinstance(
                    outcome, ToolError) else "", seconds=(now_ns() - started) / 1e9,
            ))
        return outcomes

    async def _say(self, answer: Answer, drafts: asyncio.Queue[Draft | None], text: str) -> None:
        """Speak fixed words (an apology, an announcement) as the end of the answer."""
        pieces = (*answer.said, DraftPiece(text, committed=True))
        draft = Draft(step=0, pieces=pieces, done=True, finish_reason="stop")
        self.event(answer, DraftUpdate(session=self.session_id, turn=answer.turn, step=0, committed=draft.text,
                                       draft=draft.text, pieces=tuple((p.text, True) for p in pieces)))
        await drafts.put(draft)
        answer.text = text
        self._answer_done(answer, "stop")

    def _answer_done(self, answer: Answer, finish_reason: str) -> None:
        usage = answer.usage
        self.event(answer, AnswerDone(session=self.session_id, turn=answer.turn, text=answer.text,
                                      tokens=usage.tokens, passes=usage.passes, lm_seconds=usage.seconds,
                                      finish_reason=finish_reason, prompt_tokens=usage.prompt_tokens,
                                      cached_prompt_tokens=usage.cached_prompt_tokens))

    async def _on_speech(self, answer: Answer, event: Event) -> None:
        if isinstance(event, PhraseCommitted):
            answer.marks.setdefault("first_phrase_committed", event.t_ns)
        elif isinstance(event, TtsFirstChunk):
            answer.marks.setdefault("tts_first_chunk", event.t_ns)
        self.event(answer, event)

    # --- the gate ------------------------------------------------------------------------------------------------
    def event(self, answer: Answer, event: Event) -> None:
        """Every event of an answer comes through here: dropped once cancelled, held until released."""
        if answer.gate.admit(event):
            self._deliver(answer, event)

    def release(self, answer: Answer) -> None:
        """The end of turn is confirmed: what the answer held goes out, and from now on everything goes out at once."""
        for event in answer.gate.open():
            self._deliver(answer, event)

    def _deliver(self, answer: Answer, event: Event) -> None:
        if isinstance(event, AudioOut) and answer.playback.first_audio_ns is None:
            answer.playback.first_audio_ns = now_ns()
            answer.marks["first_audio_out"] = answer.playback.first_audio_ns
            self._emit(FirstAudioOut(session=self.session_id, turn=answer.turn, t_ns=answer.playback.first_audio_ns))
            self._on_first_audio(answer)
        self._emit(event)

    def _error(self, answer: Answer, code: str, message: str) -> None:
        self.event(answer, ErrorEvent(session=self.session_id, turn=answer.turn, code=code, message=message))
