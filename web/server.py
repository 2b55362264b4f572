"""The WebSocket server: one process, many voice sessions sharing the loaded models, plus the browser page.

Per connection there is one `Session` and four named tasks: a consumer (client frames -> session), a producer
(session events -> the connection's bounded outbound queue, web/outbound.py), a sender (that queue -> the socket:
control messages first, speech paced near real time) and a watchdog (utterance length). They are joined with
FIRST_COMPLETED: whichever ends first (client gone, flood, idle, session over) ends the others, and the session is
closed in every case, so a client that disconnects mid-turn frees its model work at once. Bad input costs the client
one `error` message and that frame, never the session or the server. Everything protocol-shaped lives in
web/protocol.py; this file moves bytes. Starting it as a process (flags, threads, signals) is web/launch.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from websockets.asyncio.server import Server, ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from voice import events as ev
from voice.errors import VoiceError
from voice.listen.own_voice import ECHO_RATE, OwnVoice
from web import protocol
from web.access import Denied, check_websocket_access, own_origins, page_token_redirect
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
from web.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from web.metrics import VoiceMetrics
from web.native_memory import release_free_memory
from web.outbound import ClientTooSlow, OutboundQueue
from web.protocol import LimitExceeded
from web.ratelimit import TokenBucket, Verdict
from web.realtime.shell import REALTIME_PATH, RealtimeConnection, RealtimeSession, realtime_error_frame
from web.static_files import http_response, redirect_response, static_response
from web.tls import names_to_cover, server_ssl_context
from web.ws_events import queue_event, send_error

if TYPE_CHECKING:
    from voice.engines import Engines
    from voice.turn.session import SessionConfig

log = logging.getLogger("web.server")

WS_PATH = "/ws"
SHUTDOWN_REASON = "server shutting down"
DRAIN_MESSAGE = "this server is going away (a restart or a deploy); reconnect to be served by another"
HEALTH_PATHS = ("/healthz", "/readyz", "/metrics")
FLUSH_BEFORE_CLOSE_S = 5.0  # draining: at most this long for a session's queued speech to go out before its close
FLUSH_POLL_S = 0.05


class VoiceSession(Protocol):
    """What the server needs of voice.turn.session.Session."""

    id: str
    output_sample_rate: int

    async def start(self) -> None: ...
    async def feed_audio(self, pcm16: bytes, sample_rate: int = 16000) -> None: ...
    async def send_text(self, text: str) -> None: ...
    async def interrupt(self) -> None: ...
    def report_played(self, samples: int, turn: int | None = None) -> None: ...
    async def end_of_audio(self) -> None: ...
    def events(self) -> AsyncIterator[ev.Event]: ...
    async def close(self) -> None: ...


SessionFactory = Callable[[], VoiceSession]


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
        self._per_client: dict[str, int] = {}  # client address -> open sessions
        self._connections: dict[int, Connection] = {}  # slot -> its connection's state, while it runs
        self._next_slot = 0
        self._closing = False
        self._draining = False
        self.metrics = VoiceMetrics()
        self.metrics.sessions_max.set(web_config.max_sessions)
        self._idle = asyncio.Event()  # set while no session is open
        self._idle.set()
        self._origins: frozenset[str] = frozenset()
        self._refused: weakref.WeakKeyDictionary[ServerConnection, Denied] = weakref.WeakKeyDictionary()

    # --- lifecycle ---------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await ws_serve(
            self._handle,
            self.config.host,
            self.config.port,
            process_request=self._process_request,
            max_size=self.config.max_message_bytes,
            max_queue=self.config.max_queued_messages,
            # no permessage-deflate: a 256 KiB socket read of compressed zeros would inflate into hundreds of
            # max-size frames at once, past max_queue; PCM hardly compresses anyway
            compression=None,
            close_timeout=2,
            server_header="voice-assistant",
            ssl=server_ssl_context(self.config.tls_cert, self.config.tls_key) if self.config.tls_cert else None,
        )
        # the machine's names and addresses are looked up once, not on every handshake
        self._origins = own_origins(self.config, self.port, names_to_cover(self.config.host))
        log.info("serving %s (WebSockets at %s and %s)", self.url, WS_PATH, REALTIME_PATH)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"{self.config.scheme}://{host}:{self.port}/"

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    async def wait_until_idle(self) -> None:
        """Return once no session is open (every closed session's cleanup has finished)."""
        await self._idle.wait()

    @property
    def draining(self) -> bool:
        return self._draining

    def readiness(self) -> tuple[bool, str]:
        """Whether a balancer should send this worker a new session, and why not."""
        if self._closing or self._draining:
            return False, "draining: not accepting new sessions"
        if len(self._sessions) >= self.config.max_sessions:
            return False, f"full: {len(self._sessions)} of {self.config.max_sessions} sessions in use"
        return True, f"ready: {len(self._sessions)} of {self.config.max_sessions} sessions in use"

    async def drain(self, timeout_s: float | None = None) -> None:
        """Deploy-safe stop: refuse new sessions at once (`/readyz` answers 503, handshakes get 503), let every turn in
        flight end (at most `timeout_s`, default the config's drain timeout), closing each session as soon as it has
        no turn open with a final `error` event (`going_away`) and 1001; whatever is left then is shut down."""
        timeout = self.config.drain_timeout_s if timeout_s is None else timeout_s
        self._draining = True
        self.metrics.draining.set(1)
        log.info("draining: %d sessions open, waiting up to %.0f s for their turns", len(self._sessions), timeout)
        for state in self._connections.values():
            state.going_away.set()
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            log.warning("drain: %d sessions still had a turn open after %.0f s", len(self._sessions), timeout)
        await self.shutdown()

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
        if path in HEALTH_PATHS and not upgrade:
            return self._health_response(path)
        if path not in (WS_PATH, REALTIME_PATH):
            if upgrade:
                where = f"the WebSockets are at {WS_PATH} and {REALTIME_PATH}\n"
                return http_response(404, "Not Found", where.encode(), "text/plain")
            moved = page_token_redirect(self.config, self.port, request.path)
            if isinstance(moved, Denied):
                return _refusal(moved)
            if moved is not None:
                return redirect_response(moved.location, moved.set_cookie)
            return static_response(self.config.static_dir, request.path)
        if self._closing or self._draining:
            self.metrics.refused.labels(reason="draining").inc()
            return http_response(503, "Service Unavailable", SHUTDOWN_REASON.encode(), "text/plain")
        denied = check_websocket_access(self.config, self.port, request.path, request.headers, self._origins)
        if denied is not None:
            log.info("refused WebSocket from %s: %s", connection.remote_address, denied.reason)
            if "Origin" in request.headers and upgrade:
                # A browser shows a script nothing of a refused handshake (code 1006, no reason), so the user would
                # never learn why: open the socket only to close it at once with 1008 and the reason. No session is
                # made and nothing the client sends is read.
                self._refused[connection] = denied
                return None
            return _refusal(denied)
        return None  # websockets answers a plain GET /ws with 426 Upgrade Required

    def _health_response(self, path: str) -> Response:
        """`/healthz`: the process answers (liveness). `/readyz`: it would take a new session (a balancer's check).
        `/metrics`: Prometheus text. None of them needs the token: they carry counts, never a session's content."""
        if path == "/metrics":
            self.metrics.sessions_open.set(len(self._sessions))
            return http_response(200, "OK", self.metrics.render(), METRICS_CONTENT_TYPE)
        if path == "/healthz":
            return http_response(200, "OK", b"ok\n", "text/plain; charset=utf-8")
        ready, why = self.readiness()
        status, reason = (200, "OK") if ready else (503, "Service Unavailable")
        return http_response(status, reason, (why + "\n").encode(), "text/plain; charset=utf-8")

    # --- one connection ----------------------------------------------------------------------------------------------
    async def _handle(self, conn: ServerConnection) -> None:
        refused = self._refused.pop(conn, None)
        if refused is not None:
            await conn.close(CloseCode.POLICY_VIOLATION, _close_reason(refused.reason))
            return
        client = str(conn.remote_address[0]) if conn.remote_address else "?"
        realtime = urlsplit(conn.request.path if conn.request else "").path == REALTIME_PATH
        busy = None
        if len(self._sessions) >= self.config.max_sessions:
            message = f"server busy: {len(self._sessions)} of {self.config.max_sessions} sessions in use, try later"
            busy = ("server busy", message)
        elif self._per_client.get(client, 0) >= self.config.max_sessions_per_client:
            limit = self.config.max_sessions_per_client
            busy = ("too many sessions from your address", f"{limit} sessions are already open from {client}")
        if busy is not None:
            self.metrics.refused.labels(reason="busy").inc()
            self.metrics.error_sent("server_busy")
            with contextlib.suppress(ConnectionClosed):
                error = realtime_error_frame if realtime else protocol.error_message
                await conn.send(error("server_busy", busy[1]))
            await conn.close(CloseCode.TRY_AGAIN_LATER, busy[0])
            return
        slot = self._next_slot
        self._next_slot += 1
        self._sessions[slot] = None  # reserve before any await, so concurrent handshakes cannot overshoot the limit
        self._idle.clear()
        self._per_client[client] = self._per_client.get(client, 0) + 1
        self.metrics.sessions.inc()
        self.metrics.sessions_open.set(len(self._sessions))
        session: VoiceSession | None = None
        try:
            session = self._new_session()
            self._sessions[slot] = session
            await session.start()
            if realtime:
                close = await self._run_realtime(conn, session, slot)
            else:
                close = await self._run_connection(conn, session, slot)
            if close is not None and close.final_error is not None:
                # before this session counts as gone: a drain then shuts the server down, closing every socket
                with contextlib.suppress(ConnectionClosed):
                    await conn.send(close.final_error)
        finally:
            if session is not None:
                await session.close()
            del self._sessions[slot]
            self._connections.pop(slot, None)
            self.metrics.sessions_open.set(len(self._sessions))
            if not self._sessions:
                self._idle.set()
            self._per_client[client] -= 1
            if not self._per_client[client]:
                del self._per_client[client]
            # the session's buffers and its share of the models' working memory are free now; give them back
            await asyncio.to_thread(release_free_memory)
        if close is not None:
            await conn.close(close.code, close.reason)

    def _new_connection(self, session: VoiceSession, slot: int) -> Connection:
        out = OutboundQueue(self.config.outbound_limits, session.output_sample_rate)
        state = Connection(out, asyncio.Event(), metrics=self.metrics)
        state.idle_turns.set()
        if self._draining:
            state.going_away.set()
        self._connections[slot] = state
        return state

    async def _run_realtime(self, conn: ServerConnection, session: VoiceSession, slot: int) -> CloseWith | None:
        """The OpenAI Realtime protocol on the same session (web/realtime/); the server's session passes as one."""
        if not isinstance(session, RealtimeSession):
            return CloseWith(CloseCode.INTERNAL_ERROR, "this server's sessions cannot take Realtime instructions")
        state = self._new_connection(session, slot)
        return await RealtimeConnection(conn, session, state, self.config, self.metrics).run()

    async def _run_connection(self, conn: ServerConnection, session: VoiceSession, slot: int) -> CloseWith | None:
        state = self._new_connection(session, slot)
        limits = self.config.protocol_limits
        state.send(protocol.ready_message(session.id, session.output_sample_rate, state.input_sample_rate, limits))
        tasks = {
            asyncio.create_task(self._consume(conn, session, state), name=f"ws-consumer-{session.id}"),
            asyncio.create_task(self._produce(session, state), name=f"ws-producer-{session.id}"),
            asyncio.create_task(send_out(conn, state), name=f"ws-sender-{session.id}"),
            asyncio.create_task(self._watch_utterance(session, state), name=f"ws-watchdog-{session.id}"),
            asyncio.create_task(self._go_away_when_idle(state), name=f"ws-drain-{session.id}"),
        }
        ended = await run_tasks(tasks, session.id, self.config.shutdown_timeout_s)
        return ended or CloseWith(CloseCode.NORMAL_CLOSURE, "session ended")

    async def _consume(self, conn: ServerConnection, session: VoiceSession, state: Connection) -> CloseWith | None:
        """Client frames -> session calls. Returns how to close, or None when the client went away."""
        cfg = self.config
        limits = cfg.protocol_limits
        started = time.monotonic()
        audio = TokenBucket(cfg.audio_limit, started)
        typed = TokenBucket(cfg.typed_turn_limit, started)

        def flooding() -> None:
            flood = f"more than {cfg.max_messages_per_s:g} messages per second; frames are being dropped"
            send_error(state, LimitExceeded(flood))

        async def handle(data: str | bytes, now: float) -> CloseWith | None:
            try:
                message = protocol.parse_client_message(data, limits)
                await self._dispatch(session, state, audio, typed, message, now)
            except _CloseRequested as close:
                return close.close
            except ClientTooSlow:
                raise
            except VoiceError as exc:  # ProtocolError, LimitExceeded, AudioFormatError...: this frame only
                send_error(state, exc)
            return None

        return await receive_frames(conn, cfg, flooding, handle)

    async def _dispatch(
        self,
        session: VoiceSession,
        state: Connection,
        audio: TokenBucket,
        typed: TokenBucket,
        message: protocol.ClientMessage,
        now: float,
    ) -> None:
        limits = self.config.protocol_limits
        match message:
            case protocol.AudioFrame(pcm=pcm):
                decision = audio.take(len(pcm) / 2 / state.input_sample_rate, now)
                if decision.verdict is Verdict.CLOSE:
                    raise _CloseRequested(CloseWith(CloseCode.POLICY_VIOLATION, "audio sent faster than real time"))
                if decision.verdict is Verdict.DROP:
                    if decision.notify:
                        raise LimitExceeded(
                            f"audio arrives faster than {self.config.audio_realtime_factor:g}x real time; "
                            "frames are being dropped"
                        )
                    return
                if state.echo is None:
                    await session.feed_audio(pcm, state.input_sample_rate)
                elif cleaned := state.echo.mic(pcm, state.input_sample_rate):
                    await session.feed_audio(cleaned, ECHO_RATE)
            case protocol.Hello(sample_rate=rate, echo_cancellation=echo):
                state.input_sample_rate = rate
                if echo == "server" and state.echo is None:
                    state.echo = OwnVoice(session.output_sample_rate)
                elif echo == "client":
                    state.echo = None
                cancels = "client" if state.echo is None else "server"
                state.send(protocol.ready_message(session.id, session.output_sample_rate, rate, limits, cancels))
            case protocol.TextTurn(text=text):
                if typed.take(1.0, now).verdict is not Verdict.ACCEPT:
                    raise LimitExceeded(_typed_turn_refusal(self.config, typed.wait_s(1.0, now)))
                await session.send_text(text)
            case protocol.Interrupt():
                await session.interrupt()
            case protocol.Played(turn=turn, samples=samples):
                session.report_played(samples, turn)
                if state.echo is not None:
                    state.echo.played(turn, samples)

    async def _produce(self, session: VoiceSession, state: Connection) -> CloseWith:
        """Session events -> the outbound queue, until the session's event stream ends. Never waits for the client,
        so a slow link cannot back up into the session."""
        async for session_event in session.events():
            event = session_event if state.echo is None else state.echo.on_event(session_event)
            track_turn(state, event)
            self.metrics.observe(event)
            queue_event(state, event)
            if isinstance(event, ev.TurnEnd):
                # a turn's buffers (its audio, the answer's speech) are free now: hand the pages back, or a long
                # session keeps the peak of its longest answers (a 60-turn soak: +184 MiB over turns 5-57)
                await asyncio.to_thread(release_free_memory)
        return CloseWith(CloseCode.NORMAL_CLOSURE, "session ended")

    @staticmethod
    async def _go_away_when_idle(state: Connection) -> CloseWith:
        """Draining: end the connection once it has no turn open, so no answer is cut; the client is told why in a
        last `error` event and reconnects (through a balancer, to another worker)."""
        await until_no_turn_open(state, FLUSH_BEFORE_CLOSE_S, FLUSH_POLL_S)
        final = protocol.error_message("going_away", DRAIN_MESSAGE)
        return CloseWith(CloseCode.GOING_AWAY, SHUTDOWN_REASON, final_error=final)

    async def _watch_utterance(self, session: VoiceSession, state: Connection) -> None:
        """Cut a user utterance that runs past max_utterance_s (a television that never pauses, a stuck VAD): tell
        the client and force an endpoint, so the session transcribes what it has instead of buffering forever. The
        assistant's turn has its own bound in the session (SessionConfig.max_turn_seconds)."""
        await cut_long_utterances(state, self.config.max_utterance_s, session.end_of_audio,
                                  lambda message: send_error(state, LimitExceeded(message)))


def _typed_turn_refusal(config: WebConfig, wait_s: float) -> str:
    burst, interval = config.typed_turn_burst, config.typed_turn_interval_s
    return (
        f"typed turns arrive too fast (at most {burst:g} at once, then one every {interval:g} s): "
        f"this one was not answered; try again in {math.ceil(wait_s * 10) / 10:.1f} s"
    )


def _close_reason(text: str) -> str:
    """A close reason fits in 123 bytes of UTF-8 (RFC 6455)."""
    data = text.encode()
    return text if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."


def _refusal(denied: Denied) -> Response:
    reason = "Forbidden" if denied.status == 403 else "Unauthorized"
    return http_response(denied.status, reason, (denied.reason + "\n").encode(), "text/plain; charset=utf-8")


class _CloseRequested(Exception):
    """Control flow: the consumer must end the connection with this close code and reason."""

    def __init__(self, close: CloseWith) -> None:
        super().__init__(close.reason)
        self.close = close


def _real_session_factory(engines: Engines, session_config: SessionConfig) -> SessionFactory:
    from voice.turn.session import Session  # imported here so the protocol core and tests load without the models

    def new_session() -> VoiceSession:
        return Session(engines, session_config)

    return new_session
