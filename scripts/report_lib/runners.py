"""Run spoken turns and collect each one's latency breakdown: in-process through a `Session`, or as a WebSocket client
of a running `voice-assistant serve`. `VoiceConnection` is the one WebSocket client of the scripts (the runner's and
the soak's): the handshake and the reading of frames.

Both stream 20 ms frames (in real time unless told otherwise, so the streaming ASR, the endpointer and the early LM
start behave as with a microphone), then trailing silence so the endpointer closes the turn, and wait for that turn's
end. A clip that the endpointer splits into two utterances is one turn of the report: the one that ends last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from voice.audio import TARGET_RATE, float32_to_pcm16, load_audio_16k, stream_pcm16
from voice.engines import Engines
from voice.events import ErrorEvent, SpeechStart, Transcript, TurnEnd
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.session import Session, SessionConfig

# A live microphone keeps sending silence after the question; the end of turn is judged on that audio's clock, and
# when Smart Turn hears the question as unfinished it waits up to `incomplete_silence_ms` of it. The runners send that
# much, as a microphone would, so the turn ends on the audio's clock as measured. (A client that stops sending earlier
# no longer leaves the turn open, it once did: "no turn_end within 120 s" in CI. The session's wall clock ends it
# after `stalled_audio_ms` without audio, later than the audio would have.)
TRAILING_SILENCE_S = TurnTakingConfig().incomplete_silence_ms / 1000.0 + 0.4
TURN_TIMEOUT_S = 120.0
SPEECH_START_GRACE_S = 3.0


class ServerUnreachable(Exception):
    """The WebSocket server could not be reached or refused the connection; the message says where and why."""


@dataclass(slots=True)
class TurnResult:
    """What one spoken turn produced, whichever way it ran."""

    source: str
    transcript: str = ""
    answer: str = ""
    latency_ms: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    client_voice_to_voice: float | None = None  # WebSocket runs only: measured at the client


def turn_audio(path: Path) -> np.ndarray:
    """The clip at 16 kHz followed by trailing silence (AudioFormatError when it is not audio)."""
    silence = np.zeros(int(TRAILING_SILENCE_S * TARGET_RATE), np.float32)
    return np.concatenate([load_audio_16k(path), silence])


# --- in-process ------------------------------------------------------------------------------------------------------
class InProcessRunner:
    """One conversation through a real `Session` in this process; turns run one after another."""

    def __init__(self, engines: Engines, config: SessionConfig, realtime: bool = True) -> None:
        self._session = Session(engines, config)
        self._realtime = realtime
        self._ends: asyncio.Queue[TurnEnd | int] = asyncio.Queue()  # int: a turn whose final transcript had no words
        self._speech_turns: list[int] = []
        self._errors: list[ErrorEvent] = []
        self._collector: asyncio.Task[None] | None = None

    async def __aenter__(self) -> InProcessRunner:
        await self._session.start()
        self._collector = asyncio.create_task(self._collect(), name=f"report-collect-{self._session.id}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._session.close()
        if self._collector is not None:
            await self._collector

    async def _collect(self) -> None:
        async for event in self._session.events():
            if isinstance(event, TurnEnd):
                self._ends.put_nowait(event)
            elif isinstance(event, SpeechStart):
                self._speech_turns.append(event.turn)
            elif isinstance(event, Transcript) and event.final and not event.text.strip():
                self._ends.put_nowait(event.turn)  # noise that looked like speech: this turn ends without words
            elif isinstance(event, ErrorEvent):
                self._errors.append(event)

    async def run_turn(self, path: Path) -> TurnResult:
        result = TurnResult(str(path))
        pcm = float32_to_pcm16(turn_audio(path))
        heard_before, errors_before = len(self._speech_turns), len(self._errors)
        await stream_pcm16(lambda frame: self._session.feed_audio(frame, TARGET_RATE), pcm, realtime=self._realtime)
        await self._session.end_of_audio()
        heard = self._speech_turns[heard_before:]
        if not heard:
            result.errors.append("no speech detected in this clip")
            return result
        last = heard[-1]
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while True:
            try:
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    end = await self._ends.get()
            except TimeoutError:
                result.errors.append(f"no turn end within {TURN_TIMEOUT_S:g} s")
                break
            if isinstance(end, int):
                if end >= last:
                    result.errors.append("the final transcript had no words")
                    break
            elif end.turn >= last:
                _fill(result, end.user_text, end.answer, end.latency_ms, end.stats)
                break
        result.errors.extend(f"{e.code}: {e.message}" for e in self._errors[errors_before:])
        return result


def _fill(result: TurnResult, transcript: str, answer: str, latency: dict[str, Any], stats: dict[str, Any]) -> None:
    result.transcript, result.answer = transcript, answer
    result.latency_ms, result.stats = dict(latency), dict(stats)


# --- WebSocket client ------------------------------------------------------------------------------------------------
class VoiceConnection:
    """One connection to `voice-assistant serve`: connect, read its `ready` message, say `hello` at 16 kHz; then
    `read` hands every frame to the caller's callbacks, stamped with the client's clock on arrival.

    Every script that talks to the server as a user would (the report's runner, the soak) opens it this way, so the
    handshake and the error a user sees for an unreachable server are the same in all of them.
    """

    def __init__(self, url: str, open_timeout_s: float = 10.0) -> None:
        self.url = url
        self._open_timeout_s = open_timeout_s
        self._ws: ClientConnection | None = None
        self.ready: dict[str, Any] = {}

    async def __aenter__(self) -> VoiceConnection:
        try:
            self._ws = await connect(self.url, open_timeout=self._open_timeout_s, max_size=2**22)
            self.ready = json.loads(await asyncio.wait_for(self._ws.recv(), self._open_timeout_s))
        except (OSError, TimeoutError, InvalidURI, InvalidHandshake) as err:
            await self.close()
            reason = str(err) or type(err).__name__
            raise ServerUnreachable(f"cannot reach the voice server at {self.url}: {reason}") from err
        if self.ready.get("type") != "ready":
            await self.close()
            raise ServerUnreachable(f"{self.url} did not answer with a ready message: {self.ready}")
        await self._ws.send(json.dumps({"type": "hello", "sample_rate": TARGET_RATE}))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection (again is harmless); a `read` in progress then returns."""
        if self._ws is not None:
            await self._ws.close()

    async def send(self, frame: bytes | str) -> None:
        await self._open().send(frame)

    def _open(self) -> ClientConnection:
        if self._ws is None:
            raise RuntimeError("the connection is not open: use `async with VoiceConnection(url)`")
        return self._ws

    async def read(
        self, on_text: Callable[[dict[str, Any], float], None], on_audio: Callable[[bytes, float], None]
    ) -> str | None:
        """Hand each frame to its callback with `time.monotonic()` at its arrival (JSON text decoded) until the
        connection closes. Returns why when it broke, None when it was closed normally."""
        try:
            async for frame in self._open():
                now = time.monotonic()
                if isinstance(frame, bytes):
                    on_audio(frame, now)
                else:
                    on_text(json.loads(frame), now)
        except ConnectionClosed as closed:
            return f"connection closed: {closed}"
        return None


@dataclass(slots=True)
class _Heard:
    """What the client has received, stamped with its own clock (monotonic seconds)."""

    speech_starts: list[int] = field(default_factory=list)
    speech_end_at: dict[int, float] = field(default_factory=dict)  # turn -> client time of the user's speech end
    first_audio_at: dict[int, float] = field(default_factory=dict)  # turn -> first assistant audio frame received
    no_words: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    audio_turn: int | None = None
    ends: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    speech_started: asyncio.Event = field(default_factory=asyncio.Event)


class WebSocketRunner:
    """A client of `voice-assistant serve`: one connection is one conversation; turns run one after another.

    Besides the server's breakdown (`turn_end`), it measures voice-to-voice at the client: the arrival of the turn's
    first audio frame minus the user's speech end, which is the arrival of the `vad` speech_end message minus the
    endpoint wait it reports. That adds the server's send queue and the socket path to the server's own figure.
    """

    def __init__(self, url: str, realtime: bool = True, open_timeout_s: float = 10.0) -> None:
        self.url = url
        self._realtime = realtime
        self._connection = VoiceConnection(url, open_timeout_s)
        self._heard = _Heard()
        self._reader: asyncio.Task[None] | None = None
        self.ready: dict[str, Any] = {}

    async def __aenter__(self) -> WebSocketRunner:
        await self._connection.__aenter__()
        self.ready = self._connection.ready
        self._reader = asyncio.create_task(self._read(), name=f"report-ws-reader-{self.ready.get('session')}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._connection.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        heard = self._heard
        try:
            broken = await self._connection.read(self._on_message, self._on_audio)
            if broken is not None:
                heard.errors.append(broken)
        finally:
            heard.ends.put_nowait({"type": "closed"})  # a turn waiting for its end must not wait out its timeout

    def _on_audio(self, frame: bytes, now: float) -> None:
        heard = self._heard
        if heard.audio_turn is not None:
            heard.first_audio_at.setdefault(heard.audio_turn, now)

    def _on_message(self, message: dict[str, Any], now: float) -> None:
        heard = self._heard
        kind, turn = message.get("type"), message.get("turn")
        if kind == "vad" and message.get("state") == "speech_start":
            heard.speech_starts.append(turn)
            heard.speech_started.set()
        elif kind == "vad" and message.get("state") == "speech_end":
            heard.speech_end_at[turn] = now - float(message.get("endpoint_ms") or 0.0) / 1000.0
        elif kind == "transcript" and message.get("final") and not str(message.get("text", "")).strip():
            heard.no_words.add(turn)
            heard.ends.put_nowait(message)
        elif kind == "audio_start":
            heard.audio_turn = turn
        elif kind == "turn_end":
            heard.ends.put_nowait(message)
        elif kind == "error":
            heard.errors.append(f"{message.get('code')}: {message.get('message')}")

    async def run_turn(self, path: Path) -> TurnResult:
        result = TurnResult(str(path))
        pcm = float32_to_pcm16(turn_audio(path))
        heard = self._heard
        starts_before, errors_before = len(heard.speech_starts), len(heard.errors)
        heard.speech_started.clear()
        await stream_pcm16(self._connection.send, pcm, realtime=self._realtime)
        if len(heard.speech_starts) == starts_before:
            # the server may still be working through the last frames: give its speech_start a moment to arrive
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(heard.speech_started.wait(), SPEECH_START_GRACE_S)
        if len(heard.speech_starts) == starts_before:
            result.errors.append("no speech detected in this clip")
            result.errors.extend(heard.errors[errors_before:])
            return result
        last = heard.speech_starts[-1]
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while True:
            try:
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    end = await heard.ends.get()
            except TimeoutError:
                result.errors.append(f"no turn_end within {TURN_TIMEOUT_S:g} s")
                break
            if end["type"] == "closed":
                heard.ends.put_nowait(end)  # every later turn ends at once too
                result.errors.append("the server closed the connection before the turn ended")
                break
            if end.get("turn", -1) >= last and (end["type"] == "turn_end" or end.get("turn") in heard.no_words):
                if end["type"] == "turn_end":
                    _fill(result, end["user_text"], end["answer"], end["latency_ms"], end["stats"])
                    spoke, ended = heard.first_audio_at.get(last), heard.speech_end_at.get(last)
                    if spoke is not None and ended is not None:
                        result.client_voice_to_voice = (spoke - ended) * 1000.0
                else:
                    result.errors.append("the final transcript had no words")
                break
        result.errors.extend(heard.errors[errors_before:])
        return result
