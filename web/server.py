"""The WebSocket server: one process, many voice sessions sharing the loaded models, plus the browser page.

Per connection there is one `Session` and three named tasks: a consumer (client frames -> session), a producer
(session events -> client frames) and a watchdog (utterance length). They are joined with FIRST_COMPLETED: whichever
ends first (client gone, flood, idle, session over) ends the others, and the session is closed in every case, so a
client that disconnects mid-turn frees its model work at once. Bad input costs the client one `error` message and that
frame, never the session or the server. Everything protocol-shaped lives in web/protocol.py; this file moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from websockets.asyncio.server import Server, ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from voice import events as ev
from voice.cancellation import cancel_and_wait
from voice.errors import VoiceError
from web import protocol
from web.access import check_websocket_access
from web.config import WebConfig
from web.native_memory import limit_malloc_arenas, release_free_memory
from web.protocol import LimitExceeded
from web.ratelimit import TokenBucket, Verdict
from web.static_files import http_response, static_response

if TYPE_CHECKING:
    from voice.engines import Engines
    from voice.session import SessionConfig

log = logging.getLogger("web.server")

WS_PATH = "/ws"
SHUTDOWN_REASON = "server shutting down"


class VoiceSession(Protocol):
    """What the server needs of voice.session.Session."""

    id: str
    output_sample_rate: int

    async def start(self) -> None: ...
    async def feed_audio(self, pcm16: bytes, sample_rate: int = 16000) -> None: ...
    async def send_text(self, text: str) -> None: ...
    async def interrupt(self) -> None: ...
    async def end_of_audio(self) -> None: ...
    def events(self) -> AsyncIterator[ev.Event]: ...
    async def close(self) -> None: ...


SessionFactory = Callable[[], VoiceSession]


@dataclass(frozen=True, slots=True)
class CloseWith:
    """How a connection should end: the close code and the reason the client reads."""

    code: int
    reason: str


@dataclass(slots=True)
class _TurnClock:
    """Per-connection state shared by its tasks: when the current user utterance began (monotonic seconds, for the
    utterance watchdog) and the client's audio rate."""

    speech_since: float | None = None
    input_sample_rate: int = protocol.DEFAULT_INPUT_SAMPLE_RATE


class VoiceServer:
    """The server object; `async with VoiceServer(...) as server:` listens on `server.port` until the block ends."""

    def __init__(
        self,
        engines: Engines | None,
        session_config: SessionConfig | None,
        web_config: WebConfig,
        session_factory: SessionFactory | None = None,
    ) -> None:
        if session_factory is None:
            if engines is None or session_config is None:
                raise ValueError("VoiceServer needs engines and a session config (or a session factory)")
            session_factory = _real_session_factory(engines, session_config)
        self.config = web_config
        self._new_session = session_factory
        self._server: Server | None = None
        self._sessions: dict[int, VoiceSession | None] = {}  # slot -> session (None while it starts)
        self._next_slot = 0
        self._closing = False
        self._idle = asyncio.Event()  # set while no session is open
        self._idle.set()

    # --- lifecycle ---------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await ws_serve(
            self._handle,
            self.config.host,
            self.config.port,
            process_request=self._process_request,
            max_size=self.config.hard_max_message_bytes,
            max_queue=64,
            close_timeout=2,
            server_header="voice-assistant",
        )
        log.info("serving http://%s:%d/ (WebSocket at %s)", self.config.host, self.port, WS_PATH)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    async def wait_until_idle(self) -> None:
        """Return once no session is open (every closed session's cleanup has finished)."""
        await self._idle.wait()

    async def shutdown(self, reason: str = SHUTDOWN_REASON) -> None:
        """Stop accepting, close every session and socket (1001 with `reason`), wait for handlers (bounded)."""
        if self._server is None or self._closing:
            return
        self._closing = True
        self._server.close(close_connections=True, code=CloseCode.GOING_AWAY, reason=reason)
        try:
            async with asyncio.timeout(self.config.shutdown_timeout_s):
                await self._server.wait_closed()
        except TimeoutError:
            log.warning(
                "shutdown took longer than %.1f s; %d sessions left",
                self.config.shutdown_timeout_s,
                len(self._sessions),
            )

    async def __aenter__(self) -> VoiceServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    # --- HTTP: page, static files, handshake checks ------------------------------------------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        upgrade = "websocket" in request.headers.get("Upgrade", "").lower()
        if path != WS_PATH:
            if upgrade:
                return http_response(404, "Not Found", f"the WebSocket is at {WS_PATH}\n".encode(), "text/plain")
            return static_response(self.config.static_dir, request.path)
        if self._closing:
            return http_response(503, "Service Unavailable", SHUTDOWN_REASON.encode(), "text/plain")
        denied = check_websocket_access(self.config, self.port, request.path, request.headers)
        if denied is not None:
            log.info("refused WebSocket from %s: %s", connection.remote_address, denied.reason)
            return http_response(
                denied.status,
                "Forbidden" if denied.status == 403 else "Unauthorized",
                (denied.reason + "\n").encode(),
                "text/plain; charset=utf-8",
            )
        return None  # websockets answers a plain GET /ws with 426 Upgrade Required

    # --- one connection ----------------------------------------------------------------------------------------------
    async def _handle(self, conn: ServerConnection) -> None:
        if len(self._sessions) >= self.config.max_sessions:
            message = f"server busy: {len(self._sessions)} of {self.config.max_sessions} sessions in use, try later"
            with contextlib.suppress(ConnectionClosed):
                await conn.send(protocol.error_message("server_busy", message))
            await conn.close(CloseCode.TRY_AGAIN_LATER, "server busy")
            return
        slot = self._next_slot
        self._next_slot += 1
        self._sessions[slot] = None  # reserve before any await, so concurrent handshakes cannot overshoot the limit
        self._idle.clear()
        session: VoiceSession | None = None
        try:
            session = self._new_session()
            self._sessions[slot] = session
            await session.start()
            close = await self._run_connection(conn, session)
        finally:
            if session is not None:
                await session.close()
            del self._sessions[slot]
            if not self._sessions:
                self._idle.set()
            # the session's buffers and its share of the models' working memory are free now; give them back
            await asyncio.to_thread(release_free_memory)
        if close is not None:
            await conn.close(close.code, close.reason)

    async def _run_connection(self, conn: ServerConnection, session: VoiceSession) -> CloseWith | None:
        clock = _TurnClock()
        limits = self.config.protocol_limits
        await conn.send(protocol.ready_message(session.id, session.output_sample_rate, clock.input_sample_rate, limits))
        tasks = {
            asyncio.create_task(self._consume(conn, session, clock), name=f"ws-consumer-{session.id}"),
            asyncio.create_task(self._produce(conn, session, clock), name=f"ws-producer-{session.id}"),
            asyncio.create_task(self._watch_utterance(conn, session, clock), name=f"ws-watchdog-{session.id}"),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(*tasks, timeout_s=self.config.shutdown_timeout_s)
        for task in done:
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is not None and not isinstance(exc, ConnectionClosed):
                log.error("session %s: %s failed", session.id, task.get_name(), exc_info=exc)
                return CloseWith(CloseCode.INTERNAL_ERROR, f"internal error: {type(exc).__name__}")
            result = task.result() if exc is None else None
            if isinstance(result, CloseWith):
                return result
        return CloseWith(CloseCode.NORMAL_CLOSURE, "session ended")

    async def _consume(self, conn: ServerConnection, session: VoiceSession, clock: _TurnClock) -> CloseWith | None:
        """Client frames -> session calls. Returns how to close, or None when the client went away."""
        cfg = self.config
        limits = cfg.protocol_limits
        now = time.monotonic()
        messages = TokenBucket(cfg.message_limit, now)
        audio = TokenBucket(cfg.audio_limit, now)
        while True:
            try:
                async with asyncio.timeout(cfg.idle_timeout_s):
                    data = await conn.recv()
            except TimeoutError:
                idle = f"idle timeout: nothing received for {cfg.idle_timeout_s:g} s"
                return CloseWith(CloseCode.NORMAL_CLOSURE, idle)
            except ConnectionClosed:
                return None
            now = time.monotonic()
            decision = messages.take(1.0, now)
            if decision.verdict is Verdict.CLOSE:
                return CloseWith(CloseCode.POLICY_VIOLATION, "message flood: too many messages per second")
            if decision.verdict is Verdict.DROP:
                if decision.notify:
                    flood = f"more than {cfg.max_messages_per_s:g} messages per second; frames are being dropped"
                    await self._send_error(conn, LimitExceeded(flood))
                continue
            try:
                message = protocol.parse_client_message(data, limits)
                await self._dispatch(conn, session, clock, audio, message, now)
            except _CloseRequested as close:
                return close.close
            except VoiceError as exc:  # ProtocolError, LimitExceeded, AudioFormatError...: this frame only
                await self._send_error(conn, exc)

    async def _dispatch(
        self,
        conn: ServerConnection,
        session: VoiceSession,
        clock: _TurnClock,
        audio: TokenBucket,
        message: protocol.ClientMessage,
        now: float,
    ) -> None:
        limits = self.config.protocol_limits
        match message:
            case protocol.AudioFrame(pcm=pcm):
                decision = audio.take(len(pcm) / 2 / clock.input_sample_rate, now)
                if decision.verdict is Verdict.CLOSE:
                    raise _CloseRequested(CloseWith(CloseCode.POLICY_VIOLATION, "audio sent faster than real time"))
                if decision.verdict is Verdict.DROP:
                    if decision.notify:
                        raise LimitExceeded(
                            f"audio arrives faster than {self.config.audio_realtime_factor:g}x real time; "
                            "frames are being dropped"
                        )
                    return
                await session.feed_audio(pcm, clock.input_sample_rate)
            case protocol.Hello(sample_rate=rate):
                clock.input_sample_rate = rate
                await conn.send(protocol.ready_message(session.id, session.output_sample_rate, rate, limits))
            case protocol.TextTurn(text=text):
                await session.send_text(text)
            case protocol.Interrupt():
                await session.interrupt()

    async def _produce(self, conn: ServerConnection, session: VoiceSession, clock: _TurnClock) -> CloseWith:
        """Session events -> client frames, in order, until the session's event stream ends."""
        async for event in session.events():
            _track_turn(clock, event)
            frame = protocol.encode_event(event)
            if frame is not None:
                await conn.send(frame)
        return CloseWith(CloseCode.NORMAL_CLOSURE, "session ended")

    async def _watch_utterance(self, conn: ServerConnection, session: VoiceSession, clock: _TurnClock) -> None:
        """Cut a user utterance that runs past max_utterance_s (a television that never pauses, a stuck VAD): tell
        the client and force an endpoint, so the session transcribes what it has instead of buffering forever. The
        assistant's turn has its own bound in the session (SessionConfig.max_turn_seconds)."""
        limit = self.config.max_utterance_s
        period = min(1.0, limit / 4)
        while True:
            await asyncio.sleep(period)
            since = clock.speech_since
            if since is not None and time.monotonic() - since > limit:
                clock.speech_since = None
                await self._send_error(conn, LimitExceeded(f"utterance longer than {limit:g} s; it was cut off here"))
                await session.end_of_audio()

    @staticmethod
    async def _send_error(conn: ServerConnection, exc: VoiceError) -> None:
        await conn.send(protocol.error_message(exc.code, str(exc)))


class _CloseRequested(Exception):
    """Control flow: the consumer must end the connection with this close code and reason."""

    def __init__(self, close: CloseWith) -> None:
        super().__init__(close.reason)
        self.close = close


def _track_turn(clock: _TurnClock, event: ev.Event) -> None:
    match event:
        case ev.SpeechStart():
            clock.speech_since = time.monotonic()
        case ev.SpeechEnd() | ev.Transcript(final=True):
            clock.speech_since = None


def _real_session_factory(engines: Engines, session_config: SessionConfig) -> SessionFactory:
    from voice.session import Session  # imported here so the protocol core and tests load without the models

    def new_session() -> VoiceSession:
        return Session(engines, session_config)

    return new_session


# --- entry points ----------------------------------------------------------------------------------------------------
async def serve(
    engines: Engines,
    session_config: SessionConfig,
    web_config: WebConfig,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until `stop` is set (or the task is cancelled), then shut down gracefully."""
    stop = stop or asyncio.Event()
    async with VoiceServer(engines, session_config, web_config):
        await stop.wait()


MALLOC_ARENAS = 2  # see web.native_memory.limit_malloc_arenas
THREADS_PER_SESSION = 6  # VAD, an ASR decode, an answer (plus a cancelled one winding down), two TTS renders


def worker_threads(max_sessions: int) -> int:
    """Threads for blocking work (`asyncio.to_thread`) when `max_sessions` sessions are open.

    Sessions queue for the shared models inside worker threads (see `model.fair_lock`), and a thread waiting for a
    model holds its worker. asyncio's default pool has only cpu_count + 4 workers (6 on 2 cores): eight sessions
    waiting for the LM filled it, so a session's 1 ms VAD step waited seconds behind them, its socket stopped being
    read, and its audio then arrived in a burst that the rate limit dropped. Idle or waiting threads cost no CPU.
    """
    return THREADS_PER_SESSION * max_sessions + 4


def run_server(engines: Engines, session_config: SessionConfig, web_config: WebConfig) -> None:
    """Blocking entry point for `voice-assistant serve`: serve until SIGTERM or SIGINT, then stop accepting, close every
    session and close each socket with code 1001 and a reason. Prints the page's URL once it is listening."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        limit_malloc_arenas(MALLOC_ARENAS)
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=worker_threads(web_config.max_sessions), thread_name_prefix="voice-work")
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            async with VoiceServer(engines, session_config, web_config) as server:
                print(f"voice-assistant: serving http://{web_config.host}:{server.port}/", flush=True)
                await stop.wait()
                print("voice-assistant: shutting down", flush=True)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    asyncio.run(main())
