"""What both WebSocket protocols (/ws and /v1/realtime) share per connection, without a socket of their own: the
state their tasks share, how a connection ends, which turns are open (for draining and the utterance watchdog), the
receive loop with its idle timeout and flood limit, and the sender that drains the outbound queue onto the socket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from voice import events as ev
from voice.cancellation import cancel_and_wait
from voice.listen.own_voice import OwnVoice
from web import protocol
from web.config import WebConfig
from web.metrics import VoiceMetrics
from web.outbound import ClientTooSlow, OutboundQueue
from web.ratelimit import TokenBucket, Verdict

log = logging.getLogger("web.connection")


class Sends(Protocol):
    async def send(self, message: str | bytes) -> None: ...


class Receives(Protocol):
    async def recv(self) -> str | bytes: ...


@dataclass(frozen=True, slots=True)
class CloseWith:
    """How a connection should end: the close code and the reason the client reads."""

    code: int
    reason: str
    final_error: str | None = None  # an `error` message sent just before the close (draining says why)


async def run_tasks(tasks: set[asyncio.Task[Any]], session_id: str, shutdown_timeout_s: float) -> CloseWith | None:
    """Run a connection's tasks until the first one ends, cancel the others, and say how the connection ends: a client
    too slow to read its messages (policy violation), a task that failed (internal error, logged), or the `CloseWith`
    a task returned; None when they ended without one (the client went away)."""
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(*tasks, timeout_s=shutdown_timeout_s)
    for task in done:
        if task.cancelled():
            continue
        exc = task.exception()
        if isinstance(exc, ClientTooSlow):
            return CloseWith(CloseCode.POLICY_VIOLATION, str(exc))
        if exc is not None and not isinstance(exc, ConnectionClosed):
            log.error("session %s: %s failed", session_id, task.get_name(), exc_info=exc)
            return CloseWith(CloseCode.INTERNAL_ERROR, f"internal error: {type(exc).__name__}")
        if exc is None and isinstance(result := task.result(), CloseWith):
            return result
    return None


@dataclass(slots=True)
class Connection:
    """Per-connection state shared by its tasks: the outbound queue (and the event that wakes its sender), when the
    current user utterance began (monotonic seconds, for the utterance watchdog) and the client's audio rate."""

    out: OutboundQueue
    wake: asyncio.Event
    speech_since: float | None = None
    input_sample_rate: int = protocol.DEFAULT_INPUT_SAMPLE_RATE
    open_turns: set[int] = field(default_factory=set)  # turns begun (speech or an answer) and not yet ended
    idle_turns: asyncio.Event = field(default_factory=asyncio.Event)  # set while open_turns is empty
    going_away: asyncio.Event = field(default_factory=asyncio.Event)  # draining: close once no turn is open
    metrics: VoiceMetrics | None = None  # counts the errors this connection sends
    echo: OwnVoice | None = None  # the server cancels the assistant's voice from this client's microphone

    def send(self, frame: str) -> None:
        """Queue a control message; raises ClientTooSlow when the client has stopped reading."""
        self.out.push_control(frame)
        self.wake.set()


def track_turn(state: Connection, event: ev.Event) -> None:
    """Keep `state.open_turns` and the utterance's start in step with the session's events."""
    match event:
        case ev.SpeechStart(turn=turn):
            state.speech_since = time.monotonic()
            state.open_turns.add(turn)
        case ev.SpeechEnd() | ev.Transcript(final=True):
            state.speech_since = None
        case ev.LmStarted(turn=turn):
            state.open_turns.add(turn)
        case ev.TurnEnd(turn=turn) | ev.ErrorEvent(turn=turn):
            # a turn's end closes it and any earlier one a noise left open (a segment with no words has no TurnEnd)
            state.open_turns = {open_turn for open_turn in state.open_turns if open_turn > turn}
    if not state.open_turns:
        state.idle_turns.set()


async def receive_frames(conn: Receives, config: WebConfig, flooding: Callable[[], None],
                         handle: Callable[[str | bytes, float], Awaitable[CloseWith | None]]) -> CloseWith | None:
    """Client frames -> `handle(frame, now)`, each protocol's own parsing and dispatch. The limits both protocols
    share are kept here: nothing received for `config.idle_timeout_s` closes the socket, and frames past the message
    rate are dropped (`flooding` tells the client, once per burst) or close it when the flood goes on. Returns how
    to close: what `handle` returned, or the limit's close; None when the client went away."""
    messages = TokenBucket(config.message_limit, time.monotonic())
    while True:
        try:
            async with asyncio.timeout(config.idle_timeout_s):
                data = await conn.recv()
        except TimeoutError:
            idle = f"idle timeout: nothing received for {config.idle_timeout_s:g} s"
            return CloseWith(CloseCode.NORMAL_CLOSURE, idle)
        except ConnectionClosed:
            return None
        now = time.monotonic()
        decision = messages.take(1.0, now)
        if decision.verdict is Verdict.CLOSE:
            return CloseWith(CloseCode.POLICY_VIOLATION, "message flood: too many messages per second")
        if decision.verdict is Verdict.DROP:
            if decision.notify:
                flooding()
            continue
        if (close := await handle(data, now)) is not None:
            return close


async def send_out(conn: Sends, state: Connection) -> None:
    """The outbound queue -> the socket: whatever `pop` releases now, else sleep until it may or a push wakes us."""
    out = state.out
    while True:
        frame = out.pop(time.monotonic())
        if frame is not None:
            await conn.send(frame)
            continue
        state.wake.clear()
        wait = out.wait_s(time.monotonic())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if math.isinf(wait) else wait):
                await state.wake.wait()


async def until_no_turn_open(state: Connection, flush_s: float, poll_s: float) -> None:
    """Draining: return once the connection has no turn open (so no answer is cut) and its queued frames have gone
    out (at most `flush_s` more)."""
    await state.going_away.wait()
    while state.open_turns:
        state.idle_turns.clear()
        await state.idle_turns.wait()
    for _ in range(round(flush_s / poll_s)):
        if not state.out.has_pending():
            break
        await asyncio.sleep(poll_s)


async def cut_long_utterances(state: Connection, limit_s: float, end_of_audio: Callable[[], Awaitable[None]],
                              tell_client: Callable[[str], None]) -> None:
    """Cut a user utterance that runs past `limit_s` (a television that never pauses, a stuck VAD): tell the client
    and force an endpoint, so the session transcribes what it has instead of buffering forever."""
    period = min(1.0, limit_s / 4)
    while True:
        await asyncio.sleep(period)
        since = state.speech_since
        if since is not None and time.monotonic() - since > limit_s:
            state.speech_since = None
            tell_client(f"utterance longer than {limit_s:g} s; it was cut off here")
            await end_of_audio()
