"""One /v1/realtime connection: the async shell around `RealtimeTranslator`, on the same session, limits, outbound
queue and drain as /ws (web/server.py makes the session and counts it; web/connection.py holds what both share).

Four tasks, joined with FIRST_COMPLETED as /ws's are: a consumer (client events -> translator -> session calls), a
producer (session events -> translator -> server events), the sender (the outbound queue -> the socket) and the drain
watch. Every Realtime server event is a JSON text frame: audio goes base64 in `response.output_audio.delta`, unpaced,
as the hosted API sends it; the client plays it and says with `conversation.item.truncate` what was heard. A bad
frame costs the client one `error` event and that frame, never the session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from websockets.asyncio.server import ServerConnection
from websockets.frames import CloseCode

from voice import events as ev
from voice.errors import VoiceError
from voice.tools.loop import ClientTools
from voice.turn.tuning import TurnTuning
from web.config import WebConfig
from web.connection import (
    CloseWith,
    Connection,
    cut_long_utterances,
    receive_frames,
    run_tasks,
    send_out,
    track_turn,
    until_no_turn_open,
)
from web.metrics import VoiceMetrics
from web.native_memory import release_free_memory
from web.outbound import ClientTooSlow
from web.ratelimit import TokenBucket, Verdict
from web.realtime.actions import (
    Action,
    AnswerToolResults,
    EndAudio,
    FeedAudio,
    Interrupt,
    Send,
    SendText,
    SetInstructions,
    SetTools,
    ToolOutput,
    TruncateHeard,
    TuneTurns,
)
from web.realtime.client_events import AppendAudio, RealtimeError, SessionUpdate, parse_client_event
from web.realtime.translator import RealtimeTranslator

log = logging.getLogger("web.realtime")

REALTIME_PATH = "/v1/realtime"
FLUSH_BEFORE_CLOSE_S = 5.0
FLUSH_POLL_S = 0.05
GOING_AWAY = "this server is going away (a restart or a deploy); reconnect to be served by another"


@runtime_checkable
class RealtimeSession(Protocol):
    """What the Realtime shell needs of voice.turn.session.Session: /ws's needs, the instructions, and the client's
    own tools."""

    id: str
    output_sample_rate: int

    @property
    def instructions(self) -> str: ...
    def set_instructions(self, text: str | None) -> None: ...
    @property
    def turn_tuning(self) -> TurnTuning: ...
    def tune_turns(self, tuning: TurnTuning) -> None: ...
    def set_client_tools(self, tools: ClientTools) -> None: ...
    def add_tool_result(self, call_id: str, output: str) -> None: ...
    async def answer_tool_results(self) -> None: ...
    async def feed_audio(self, pcm16: bytes, sample_rate: int = 16000) -> None: ...
    async def send_text(self, text: str) -> None: ...
    async def interrupt(self) -> None: ...
    def truncate_heard(self, turn: int, samples: int) -> str | None: ...
    async def end_of_audio(self) -> None: ...
    def events(self) -> AsyncIterator[ev.Event]: ...


class RealtimeConnection:
    """Runs one connection until it ends; `run` returns how to close it (None: the client went away)."""

    def __init__(self, conn: ServerConnection, session: RealtimeSession, state: Connection, config: WebConfig,
                 metrics: VoiceMetrics) -> None:
        self.conn = conn
        self.session = session
        self.state = state
        self.config = config
        self.metrics = metrics
        self.translator = RealtimeTranslator(session.id, session.output_sample_rate, session.instructions,
                                             server_tuning=session.turn_tuning)

    async def run(self) -> CloseWith | None:
        self._do(self.translator.start())
        name = self.session.id
        tasks = {
            asyncio.create_task(self._consume(), name=f"realtime-consumer-{name}"),
            asyncio.create_task(self._produce(), name=f"realtime-producer-{name}"),
            asyncio.create_task(send_out(self.conn, self.state), name=f"realtime-sender-{name}"),
            asyncio.create_task(self._go_away_when_idle(), name=f"realtime-drain-{name}"),
            asyncio.create_task(cut_long_utterances(self.state, self.config.max_utterance_s, self.session.end_of_audio,
                                                    self._utterance_cut), name=f"realtime-watchdog-{name}"),
        }
        return await run_tasks(tasks, self.session.id, self.config.shutdown_timeout_s)

    # --- client -> session ---------------------------------------------------------------------------------------
    async def _consume(self) -> CloseWith | None:
        cfg = self.config
        started = time.monotonic()
        audio = TokenBucket(cfg.audio_limit, started)
        typed = TokenBucket(cfg.typed_turn_limit, started)

        def flooding() -> None:
            self._error(RealtimeError(f"more than {cfg.max_messages_per_s:g} events per second; events are being "
                                      "dropped", "rate_limit_exceeded"))

        async def handle(data: str | bytes, now: float) -> CloseWith | None:
            try:
                event = parse_client_event(data, self.translator.settings, cfg.max_text_chars)
                if isinstance(event, AppendAudio):
                    fmt = self.translator.settings.input_format
                    seconds = len(event.audio) / fmt.bytes_per_sample / fmt.rate
                    decision = audio.take(seconds, now)
                    if decision.verdict is Verdict.CLOSE:
                        return CloseWith(CloseCode.POLICY_VIOLATION, "audio sent faster than real time")
                    if decision.verdict is Verdict.DROP:
                        if decision.notify:
                            raise RealtimeError(f"audio arrives faster than {cfg.audio_realtime_factor:g}x real "
                                                "time; appends are being dropped", "rate_limit_exceeded", "audio",
                                                event.event_id)
                        return None
                before = self.translator.settings
                actions = self.translator.client_event(event)
                if any(isinstance(action, SendText | AnswerToolResults) for action in actions) and \
                        typed.take(1.0, now).verdict is not Verdict.ACCEPT:
                    raise RealtimeError("typed turns arrive too fast; this response was not started",
                                        "rate_limit_exceeded", None, event.event_id)
                try:
                    await self._run_actions(actions)
                except RealtimeError as err:
                    if isinstance(event, SessionUpdate):
                        self.translator.settings = before  # a refused update changes nothing
                    err.event_id = err.event_id or event.event_id
                    raise
            except ClientTooSlow:
                raise
            except RealtimeError as err:
                self._error(err)
            except VoiceError as err:  # the session refused the call (a bad frame, a closed session): this frame only
                self._error(RealtimeError(str(err), err.code))
            return None

        return await receive_frames(self.conn, cfg, flooding, handle)

    async def _run_actions(self, actions: list[Action]) -> None:
        session = self.session
        for action in actions:
            match action:
                case Send():
                    self._do([action])
                case FeedAudio(pcm=pcm, sample_rate=rate):
                    await session.feed_audio(pcm, rate)
                case EndAudio():
                    await session.end_of_audio()
                case SendText(text=text):
                    await session.send_text(text)
                case Interrupt():
                    await session.interrupt()
                case TruncateHeard(samples=samples, turn=turn):
                    if session.truncate_heard(turn, samples) is None:
                        raise RealtimeError("that answer can no longer be truncated: a newer turn has ended",
                                            "item_not_found", "item_id")
                case SetInstructions(text=text):
                    session.set_instructions(text)
                case TuneTurns(tuning=tuning):
                    try:
                        session.tune_turns(tuning)
                    except VoiceError as err:
                        raise RealtimeError(str(err), "invalid_value", "session.audio.input.turn_detection") \
                            from None
                case SetTools(tools=tools):
                    try:
                        session.set_client_tools(tools)
                    except VoiceError as err:  # a name of the server's own tools, or a model without a grammar
                        raise RealtimeError(str(err), "invalid_tools", "session.tools") from None
                case ToolOutput(call_id=call_id, output=output):
                    try:
                        session.add_tool_result(call_id, output)
                    except VoiceError as err:
                        raise RealtimeError(str(err), "invalid_call_id", "item.call_id") from None
                case AnswerToolResults():
                    await session.answer_tool_results()

    # --- session -> client ---------------------------------------------------------------------------------------
    async def _produce(self) -> CloseWith:
        async for event in self.session.events():
            track_turn(self.state, event)
            self.metrics.observe(event)
            try:
                await self._run_actions(self.translator.session_event(event))
            except RealtimeError as err:  # a late truncate the history could no longer take
                log.info("session %s: %s", self.session.id, err)
            if isinstance(event, ev.TurnEnd):
                await asyncio.to_thread(release_free_memory)
        return CloseWith(CloseCode.NORMAL_CLOSURE, "session ended")

    def _do(self, actions: list[Action]) -> None:
        """Queue the server events among `actions` (session events only ever become these)."""
        for action in actions:
            if isinstance(action, Send):
                self.state.send(json.dumps(action.event, ensure_ascii=False, separators=(",", ":")))

    def _error(self, err: RealtimeError) -> None:
        self.metrics.error_sent(err.code if isinstance(err.code, str) else "invalid_request_error")
        self._do([self.translator.error(err)])

    def _utterance_cut(self, message: str) -> None:
        self._error(RealtimeError(message, "utterance_too_long"))

    async def _go_away_when_idle(self) -> CloseWith:
        """Draining: as on /ws, close once no turn is open, with a last `error` saying why."""
        await until_no_turn_open(self.state, FLUSH_BEFORE_CLOSE_S, FLUSH_POLL_S)
        final = json.dumps(self.translator.error(VoiceError(GOING_AWAY), "going_away").event)
        return CloseWith(CloseCode.GOING_AWAY, "server shutting down", final_error=final)


def realtime_error_frame(code: str, message: str) -> str:
    """A server-side refusal in the Realtime error shape, before any session exists (the server is busy)."""
    error = {"type": "server_error", "code": code, "message": message, "param": None, "event_id": None}
    return json.dumps({"type": "error", "event_id": f"event_{code}", "error": error})
