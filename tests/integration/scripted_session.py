"""A scripted stand-in for voice.turn.session.Session, so the server's socket, limits and HTTPS can be tested over real
loopback sockets in seconds, without models."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from voice import events as ev
from voice.listen.stage import ListenConfig
from voice.tools.loop import ClientTools
from voice.turn.tuning import TurnTuning
from web.config import WebConfig
from web.server import VoiceServer

RATE = 16_000
CHUNK = b"\x00\x10" * (RATE // 10)  # 100 ms of speech


class ScriptedSession:
    """Stands in for voice.turn.session.Session: a typed turn answers with `speech_s` of audio produced at once (as a
    fast
    TTS does); `interrupt` clears it, and a late chunk of the cancelled turn still arrives, as from a TTS thread."""

    output_sample_rate = RATE

    def __init__(self, speech_s: float = 5.0, drafts: int = 0) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.speech_s = speech_s
        self.drafts = drafts
        self.gate = asyncio.Event()  # feed_audio waits on it: a session busy decoding
        self.gate.set()
        self.fed = 0
        self.played: list[tuple[int | None, int]] = []  # (turn, samples) reports from the client
        self.texts: list[str] = []  # typed turns the server passed on
        self.system_prompt = "Be helpful."  # what a Realtime client's instructions set
        self.client_tools = ClientTools()
        self.tuning = TurnTuning()
        self.tool_results: list[tuple[str, str]] = []
        self._out: asyncio.Queue[ev.Event | None] = asyncio.Queue()

    async def start(self) -> None:
        pass

    async def feed_audio(self, pcm16: bytes, sample_rate: int = RATE) -> None:
        await self.gate.wait()
        self.fed += 1

    async def send_text(self, text: str) -> None:
        self.texts.append(text)
        emit = self._out.put_nowait
        for step in range(self.drafts):
            emit(ev.DraftUpdate(session=self.id, turn=1, step=step, committed="", draft="x" * 1000, pieces=()))
        emit(ev.AudioStart(session=self.id, turn=1, sample_rate=RATE))
        for _ in range(round(self.speech_s * 10)):
            emit(ev.AudioOut(session=self.id, turn=1, pcm=CHUNK, sample_rate=RATE, phrase_id=0))
        emit(
            ev.AnswerDone(session=self.id, turn=1, text=text, tokens=1, passes=1, lm_seconds=0.1, finish_reason="stop")
        )
        emit(ev.AudioEnd(session=self.id, turn=1))

    async def interrupt(self) -> None:
        emit = self._out.put_nowait
        emit(ev.Clear(session=self.id, turn=1, reason="interrupt"))
        emit(ev.AudioOut(session=self.id, turn=1, pcm=CHUNK, sample_rate=RATE, phrase_id=1))
        emit(
            ev.TurnEnd(
                session=self.id, turn=1, user_text="", answer="", spoken="", interrupted=True, latency_ms={}, stats={}
            )
        )

    async def end_of_audio(self) -> None:
        pass

    def report_played(self, samples: int, turn: int | None = None) -> None:
        self.played.append((turn, samples))

    def truncate_heard(self, turn: int, samples: int) -> str | None:
        self.played.append((turn, samples))
        return ""

    @property
    def instructions(self) -> str:
        return self.system_prompt

    def set_instructions(self, text: str | None) -> None:
        self.system_prompt = text or "Be helpful."

    @property
    def turn_tuning(self) -> TurnTuning:
        return self.tuning.filled(ListenConfig())

    def tune_turns(self, tuning: TurnTuning) -> None:
        self.tuning = tuning

    def set_client_tools(self, tools: ClientTools) -> None:
        self.client_tools = tools

    def add_tool_result(self, call_id: str, output: str) -> None:
        self.tool_results.append((call_id, output))

    async def answer_tool_results(self) -> None:
        await self.send_text("")

    async def events(self) -> AsyncIterator[ev.Event]:
        while (event := await self._out.get()) is not None:
            yield event

    async def close(self) -> None:
        self._out.put_nowait(None)


def scripted_server(
    config: WebConfig, session_class: type[ScriptedSession] = ScriptedSession, **session_args: float
) -> tuple[VoiceServer, list[ScriptedSession]]:
    """A server whose every connection gets a new `session_class(**session_args)`; the list collects them."""
    sessions: list[ScriptedSession] = []

    def factory() -> ScriptedSession:
        sessions.append(session_class(**session_args))
        return sessions[-1]

    return VoiceServer(None, None, config, session_factory=factory), sessions
