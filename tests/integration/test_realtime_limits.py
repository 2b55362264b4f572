"""/v1/realtime's limits over real loopback sockets with the official `openai` client and a scripted session (no
models, seconds): a flood of appends is dropped with one `error` while the session answers on and another session is
untouched; the token and the per-address limit hold as on /ws; instructions reach the session."""

from __future__ import annotations

import asyncio
import base64
import functools

import pytest
from openai import AsyncOpenAI

from tests.integration import realtime_client
from tests.integration.scripted_session import ScriptedSession, scripted_server
from voice import events as ev
from voice.errors import ProtocolError
from voice.turn.tuning import TurnTuning
from web.config import WebConfig

TOKEN = "realtime-limits-token-0123"
CHUNK_24K = base64.b64encode(b"\x00\x10" * 2400).decode()  # 100 ms of PCM16 at 24 kHz
HELLO = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}


until = functools.partial(realtime_client.until, timeout_s=10.0)  # a scripted session answers at once


class AnsweringSession(ScriptedSession):
    """The scripted session, with the events a real answer begins and ends with (a response needs both)."""

    def __init__(self, speech_s: float = 5.0) -> None:
        super().__init__(speech_s)
        self.prompts: list[str] = []

    async def send_text(self, text: str) -> None:
        self.prompts.append(self.system_prompt)  # what this answer is written under
        self._out.put_nowait(ev.LmStarted(session=self.id, turn=1))
        await super().send_text(text)
        self._out.put_nowait(ev.TurnEnd(session=self.id, turn=1, user_text=text, answer=text, spoken=text,
                                        interrupted=False, latency_ms={}, stats={}))


def client(port: int, key: str = TOKEN) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, websocket_base_url=f"ws://127.0.0.1:{port}/v1")


def test_a_flood_of_appends_is_dropped_with_one_error_and_other_sessions_are_untouched() -> None:
    async def scenario() -> tuple[list, list, list]:
        server, sessions = scripted_server(WebConfig(port=0, token=TOKEN), AnsweringSession, speech_s=0.5)
        async with server, client(server.port).realtime.connect(model="m") as flood, \
                client(server.port).realtime.connect(model="m") as calm:
            await until(flood, "session.created", [])
            await until(calm, "session.created", [])
            for _ in range(80):  # 8 s of audio at once: past the 3 s burst, short of the 10 s that close
                await flood.input_audio_buffer.append(audio=CHUNK_24K)
            await flood.session.update(session={"type": "realtime", "instructions": "Answer in French."})
            flooded = await until(flood, "session.updated", [])
            await flood.conversation.item.create(item=HELLO)  # type: ignore[arg-type]
            await flood.response.create()
            await until(flood, "response.done", flooded)
            await calm.conversation.item.create(item=HELLO)  # type: ignore[arg-type]
            await calm.response.create()
            untouched = await until(calm, "response.done", [])
        return flooded, untouched, sessions

    flooded, untouched, sessions = asyncio.run(scenario())
    errors = [e.error for e in flooded if e.type == "error"]
    assert [e.code for e in errors] == ["rate_limit_exceeded"], errors
    assert 25 <= sessions[0].fed <= 40  # the burst (3 s) and what the rate refilled; the rest dropped
    assert sessions[0].system_prompt == "Answer in French." and sessions[0].texts == ["hello"]
    assert [e.type for e in flooded if e.type.startswith("response.")][:2] == ["response.created",
                                                                                "response.output_item.added"]
    assert not [e for e in untouched if e.type == "error"] and sessions[1].fed == 0 and sessions[1].texts == ["hello"]


def test_token_and_per_address_limit() -> None:
    async def scenario() -> list:
        server, _ = scripted_server(WebConfig(port=0, token=TOKEN, max_sessions_per_client=1))
        async with server:
            with pytest.raises(Exception, match="401"):
                async with client(server.port, "not-the-token").realtime.connect(model="m") as conn:
                    await conn.recv()
            async with client(server.port).realtime.connect(model="m") as first:
                await until(first, "session.created", [])
                async with client(server.port).realtime.connect(model="m") as second:
                    return await until(second, "error", [])

    refused = asyncio.run(scenario())
    assert "sessions are already open" in refused[-1].error.message


def test_draining_closes_an_idle_realtime_session_with_a_last_error() -> None:
    async def scenario() -> list:
        server, _ = scripted_server(WebConfig(port=0, token=TOKEN), AnsweringSession, speech_s=0.2)
        async with server, client(server.port).realtime.connect(model="m") as conn:
            got = await until(conn, "session.created", [])
            drain = asyncio.create_task(server.drain(timeout_s=5))
            await until(conn, "error", got)
            await drain
            return got

    got = asyncio.run(scenario())
    assert got[-1].error.code == "going_away" and got[-1].error.type == "server_error"


class EndlessSpeech(AnsweringSession):
    """Hears speech begin at the first audio and never end (a television): the watchdog must cut it."""

    cut = False

    async def feed_audio(self, pcm16: bytes, sample_rate: int = 16_000) -> None:
        if not self.fed:
            self._out.put_nowait(ev.SpeechStart(session=self.id, turn=1))
        await super().feed_audio(pcm16, sample_rate)

    async def end_of_audio(self) -> None:
        self.cut = True


def test_an_endless_utterance_is_cut_with_an_error() -> None:
    async def scenario() -> tuple[list, list]:
        server, sessions = scripted_server(WebConfig(port=0, token=TOKEN, max_utterance_s=0.5), EndlessSpeech)
        async with server, client(server.port).realtime.connect(model="m") as conn:
            got = await until(conn, "session.created", [])
            await conn.input_audio_buffer.append(audio=CHUNK_24K)
            await until(conn, "error", got)
        return got, sessions

    got, sessions = asyncio.run(scenario())
    assert "input_audio_buffer.speech_started" in [e.type for e in got]
    assert got[-1].error.code == "utterance_too_long" and sessions[0].cut


def test_response_instructions_apply_to_that_response_only() -> None:
    async def scenario() -> list:
        server, sessions = scripted_server(WebConfig(port=0, token=TOKEN), AnsweringSession, speech_s=0.2)
        async with server, client(server.port).realtime.connect(model="m") as conn:
            await until(conn, "session.created", [])
            for instructions in ("Answer in one word.", None):
                await conn.conversation.item.create(item=HELLO)  # type: ignore[arg-type]
                await conn.response.create(response={"instructions": instructions} if instructions else {})
                await until(conn, "response.done", [])
        return sessions

    (session,) = asyncio.run(scenario())
    assert session.prompts == ["Answer in one word.", "Be helpful."] and session.system_prompt == "Be helpful."


class PickyListener(AnsweringSession):
    """Refuses a VAD threshold above 0.9, as a listener whose endpointer cannot take it would."""

    def tune_turns(self, tuning: TurnTuning) -> None:
        if tuning.vad_threshold is not None and tuning.vad_threshold > 0.9:
            raise ProtocolError("the endpointer cannot take that threshold")
        super().tune_turns(tuning)


def test_turn_detection_reaches_the_session_and_a_refused_one_changes_nothing() -> None:
    def server_vad(**values: float) -> dict:
        return {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad", **values}}}}

    async def scenario() -> tuple[list, list, list]:
        server, sessions = scripted_server(WebConfig(port=0, token=TOKEN), PickyListener)
        async with server, client(server.port).realtime.connect(model="m") as conn:
            created = await until(conn, "session.created", [])
            await conn.session.update(session=server_vad(threshold=0.7, silence_duration_ms=900,  # type: ignore[arg-type]
                                                         prefix_padding_ms=200))
            tuned = await until(conn, "session.updated", [])
            tunings = [sessions[0].tuning]
            await conn.session.update(session=server_vad(threshold=0.95), event_id="picky")  # type: ignore[arg-type]
            refused = await until(conn, "error", [])
            await conn.session.update(session={"type": "realtime", "instructions": "Be brief."})
            refused = await until(conn, "session.updated", refused)
            tunings.append(sessions[0].tuning)
            await conn.session.update(session={"type": "realtime", "audio": {"input": {  # type: ignore[arg-type]
                "turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}})
            await until(conn, "session.updated", [])
            tunings.append(sessions[0].tuning)
        return created, tuned, refused, tunings

    created, tuned, refused, tunings = asyncio.run(scenario())
    assert created[0].session.audio.input.turn_detection.type == "semantic_vad"
    vad = tuned[-1].session.audio.input.turn_detection
    assert (vad.threshold, vad.silence_duration_ms, vad.prefix_padding_ms) == (0.7, 900, 200)
    assert tunings[0] == TurnTuning(0.7, 900, 200)
    error = refused[0].error
    assert error.event_id == "picky" and error.param == "session.audio.input.turn_detection"
    assert refused[-1].session.audio.input.turn_detection.threshold == 0.7  # the refused update changed nothing
    assert tunings[1] == TurnTuning(0.7, 900, 200) and tunings[2] == TurnTuning(patience=2.0)
