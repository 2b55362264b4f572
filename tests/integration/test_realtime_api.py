"""/v1/realtime with the official `openai` client (client.realtime.connect) against the real server and real models on
loopback: real recorded speech streamed in real time, server VAD (semantic) and manual commits, cancel and truncate,
and bad input answered with `error` events while the session lives on."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import pytest
from openai import AsyncOpenAI

from tests.integration.realtime_client import until
from tests.integration.ws_harness import SPEECH_WORDS, running_server, speech_pcm16
from voice.audio import float32_to_pcm16, pcm16_to_float32, resample
from voice.engines import Engines
from web.config import WebConfig
from web.realtime.audio import PCMU, from_pcm16

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RATE = 24_000
CHUNK_S = 0.1
TOKEN = "realtime-test-token-0123"
USER_TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello how are you"}]}


def speech_24k() -> bytes:
    """The LibriVox clip ("he was not an ill disposed young man") as the API's default PCM16 at 24 kHz."""
    return float32_to_pcm16(resample(pcm16_to_float32(speech_pcm16()), 16_000, RATE))


async def stream(conn, pcm: bytes) -> None:
    """Append `pcm` in 100 ms chunks at the pace of speech."""
    step = int(RATE * CHUNK_S) * 2
    start = time.monotonic()
    for n, i in enumerate(range(0, len(pcm), step)):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + step]).decode())
        await asyncio.sleep(max(0.0, start + (n + 1) * CHUNK_S - time.monotonic()))


def of(got: list, kind: str) -> list:
    return [e for e in got if e.type == kind]


def index(got: list, kind: str) -> int:
    return next(i for i, e in enumerate(got) if e.type == kind)


def client_for(port: int) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="local", websocket_base_url=f"ws://127.0.0.1:{port}/v1")


def heard(transcript: str) -> set[str]:
    return set(transcript.lower().replace(".", "").replace("-", " ").split()) & SPEECH_WORDS


def test_speech_with_semantic_vad_then_manual_commit(engines: Engines) -> None:
    async def scenario() -> tuple[list, list, list, list]:
        async with running_server(engines) as server, \
                client_for(server.port).realtime.connect(model="voice-assistant") as conn:
            greeting = await until(conn, "session.created", [])
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
                "type": "semantic_vad", "eagerness": "auto"}}}})
            await until(conn, "session.updated", greeting)
            vad: list = []
            sender = asyncio.create_task(stream(conn, speech_24k()))
            await until(conn, "response.done", vad)
            await sender

            await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            manual = await until(conn, "session.updated", [])
            await stream(conn, speech_24k())
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            await until(conn, "response.done", manual)

            # telephony: the whole utterance as one μ-law user item, answered when asked
            await conn.session.update(session={"type": "realtime", "audio": {"input": {
                "format": {"type": "audio/pcmu"}, "turn_detection": {"type": "server_vad"}}}})
            item = await until(conn, "session.updated", [])
            mulaw = from_pcm16(float32_to_pcm16(resample(pcm16_to_float32(speech_pcm16()), 16_000, 8_000)), PCMU)
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_audio", "audio": base64.b64encode(mulaw).decode()}]})
            await until(conn, "conversation.item.input_audio_transcription.completed", item)
            await conn.response.create()
            await until(conn, "response.done", item)
        return greeting, vad, manual, item

    greeting, vad, manual, item = asyncio.run(scenario())
    created = of(greeting, "session.created")[0].session
    assert created.audio.input.format.type == "audio/pcm" and created.audio.output.format.rate == RATE
    updated = of(greeting, "session.updated")[0].session
    assert updated.audio.input.turn_detection.type == "semantic_vad"

    kinds = [e.type for e in vad]
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                 "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed",
                 "response.created", "response.output_audio.delta", "response.output_audio_transcript.delta",
                 "response.output_audio.done", "response.output_audio_transcript.done", "response.done"):
        assert kind in kinds, (kind, kinds)
    assert index(vad, "input_audio_buffer.speech_started") < index(vad, "input_audio_buffer.speech_stopped") \
        < index(vad, "response.created") < index(vad, "response.output_audio.delta") < index(vad, "response.done")
    transcript = of(vad, "conversation.item.input_audio_transcription.completed")[-1].transcript
    assert len(heard(transcript)) >= 5, transcript
    user_item = of(vad, "input_audio_buffer.committed")[0].item_id
    assert of(vad, "conversation.item.input_audio_transcription.completed")[-1].item_id == user_item
    audio = b"".join(base64.b64decode(e.delta) for e in of(vad, "response.output_audio.delta"))
    assert len(audio) > RATE // 2 and len(audio) % 2 == 0  # over 250 ms of PCM16
    done = of(vad, "response.done")[0].response
    spoken = of(vad, "response.output_audio_transcript.done")[0].transcript
    assert done.status == "completed" and done.usage.output_tokens > 0 and spoken
    assert done.usage.input_tokens > 0 and done.usage.total_tokens == done.usage.input_tokens + \
        done.usage.output_tokens  # the LM's own counts of the prompt it read
    assert done.output[0].content[0].transcript == spoken

    manual_kinds = [e.type for e in manual]
    assert "input_audio_buffer.speech_started" not in manual_kinds  # no server VAD events without turn detection
    assert manual_kinds.index("input_audio_buffer.committed") < manual_kinds.index("response.created")
    assert len(heard(of(manual, "conversation.item.input_audio_transcription.completed")[-1].transcript)) >= 5
    assert of(manual, "response.output_audio.delta") and of(manual, "response.done")[0].response.status == "completed"

    item_kinds = [e.type for e in item]
    assert "input_audio_buffer.speech_started" not in item_kinds  # an item's audio is not the microphone's
    assert len(heard(of(item, "conversation.item.input_audio_transcription.completed")[-1].transcript)) >= 5
    # held until response.create, although server VAD creates responses (else that create would be refused)
    assert not of(item, "error") and item_kinds.count("response.created") == 1
    assert of(item, "response.done")[0].response.status == "completed"


def test_bad_input_gets_errors_and_the_session_lives_on(engines: Engines) -> None:
    async def scenario() -> tuple[list, list]:
        config = WebConfig(port=0, token=TOKEN)
        async with running_server(engines, config) as server:
            refused = AsyncOpenAI(api_key="wrong", websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
            with pytest.raises(Exception, match="401"):
                async with refused.realtime.connect(model="voice-assistant") as conn:
                    await conn.recv()
            client = AsyncOpenAI(api_key=TOKEN, websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
            async with client.realtime.connect(model="voice-assistant") as conn:
                got = await until(conn, "session.created", [])
                await conn.send({"type": "no.such.event", "event_id": "bad-1"})  # type: ignore[arg-type]
                await conn.input_audio_buffer.append(audio=base64.b64encode(b"\x00\x01\x02").decode(),
                                                     event_id="bad-2")
                await conn.send({"type": "input_audio_buffer.append", "audio": "%%%", "event_id": "bad-3"})
                await conn.send({"type": "session.update", "event_id": "bad-4",  # type: ignore[arg-type]
                                 "session": {"type": "realtime", "speling": 1}})
                await conn.session.update(session={"type": "realtime", "tools": [  # type: ignore[list-item]
                    {"type": "mcp", "server_label": "get_weather"}]}, event_id="bad-5")
                await conn.response.cancel(event_id="bad-6")
                await conn.send({"type": "session.update", "session": {"type": "realtime", "audio": {
                    "output": {"format": {"type": "audio/pcmu"}}}}})
                await until(conn, "session.updated", got)
                await conn.conversation.item.create(item=USER_TEXT)  # type: ignore[arg-type]
                await conn.response.create()
                answered = await until(conn, "response.output_audio.delta", [])
                await conn.response.cancel()
                answer_item = of(answered, "response.output_item.added")[0].item.id
                await conn.conversation.item.truncate(item_id=answer_item, content_index=0, audio_end_ms=0)
                await until(conn, "response.done", answered)
        return got, answered

    got, answered = asyncio.run(scenario())
    errors = {e.error.event_id: e.error for e in of(got, "error")}
    assert set(errors) == {"bad-1", "bad-2", "bad-3", "bad-4", "bad-5", "bad-6"}, errors
    assert errors["bad-1"].code == "unknown_event" and "no.such.event" in errors["bad-1"].message
    assert errors["bad-2"].code == "invalid_audio" and errors["bad-3"].code == "invalid_audio"
    assert errors["bad-4"].param == "session.speling"
    assert errors["bad-5"].code == "unsupported" and errors["bad-5"].param == "session.tools[0].type"
    assert errors["bad-6"].code == "response_cancel_not_active"
    assert all(e.error.type == "invalid_request_error" for e in of(got, "error"))
    # the session took the μ-law update and answered, and the cancel ended that answer with what was heard
    assert of(answered, "conversation.item.truncated")[0].audio_end_ms == 0
    done = of(answered, "response.done")[0].response
    assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"
    assert done.audio.output.format.type == "audio/pcmu"
    first = base64.b64decode(of(answered, "response.output_audio.delta")[0].delta)
    assert first and set(first) != {0}  # μ-law bytes: one per sample, silence is 0xFF not 0x00


def test_barge_in_then_truncate_leaves_the_history_as_heard(engines: Engines) -> None:
    async def scenario() -> tuple[list, list, list, tuple]:
        async with running_server(engines) as server, \
                client_for(server.port).realtime.connect(model="voice-assistant") as conn:
            await until(conn, "session.created", [])
            await conn.conversation.item.create(item={  # type: ignore[arg-type]
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "tell me a long story about the sun"}]})
            await conn.response.create()
            answered = await until(conn, "response.output_audio.delta", [])
            sender = asyncio.create_task(stream(conn, speech_24k()))  # the user speaks over the answer
            await until(conn, "response.done", answered)
            item_id = of(answered, "response.output_item.added")[0].item.id
            await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=0)
            truncated = await until(conn, "conversation.item.truncated", [])
            (session,) = server._sessions.values()  # the history right after the truncate, before the next turn ends
            history = tuple(session.dialogue.history)
            next_turn = await until(conn, "response.done", [])
            await sender
        return answered, truncated, next_turn, history

    answered, truncated, next_turn, history = asyncio.run(scenario())
    done = of(answered, "response.done")[0].response
    assert done.status == "cancelled" and done.status_details.reason == "turn_detected"
    assert "input_audio_buffer.speech_started" in [e.type for e in answered]
    assert not of(truncated, "error"), of(truncated, "error")
    # nothing of the answer was heard (audio_end_ms 0): the history keeps the user's words and no answer
    assert [m.role for m in history] == ["user"] and "story" in history[0].content
    # the user's words may be transcribed before the truncate is acknowledged (on a slow or loaded machine)
    transcribed = of(answered + truncated + next_turn, "conversation.item.input_audio_transcription.completed")
    transcript = transcribed[-1].transcript
    assert len(heard(transcript)) >= 5, transcript
    assert of(next_turn, "response.done")[0].response.status == "completed"


def test_a_tool_call_its_output_and_the_spoken_answer(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The session's own tools (`--tools`) through Realtime events, on a spoken question (Piper's voice): the LM is
    the scripted tool-capable stand-in of tests/integration/test_voice_tools_ws.py (the bundled model almost never
    calls a tool); the ASR, the tool, the TTS, the server and the official client are real."""
    from model.chat.tools import call_text
    from scripts.report_lib.inputs import synthesised_questions
    from tests.unit.test_voice_tools import ScriptedLM
    from voice.audio import load_audio_16k
    from voice.listen.asr_models import load_model
    from voice.speak.tts import load_synthesizer
    from voice.think.spoken import spoken_answer
    from voice.tools.toolbox import ToolsConfig
    from voice.turn.session import SessionConfig
    from web.server import VoiceServer

    [question] = synthesised_questions(tmp_path_factory.mktemp("speech"), ("What time is it?",))
    samples = load_audio_16k(question)
    padded = float32_to_pcm16(resample(np.concatenate([np.zeros(3200, np.float32), samples,
                                                       np.zeros(24000, np.float32)]), 16_000, RATE))
    lm = ScriptedLM(lambda user: call_text("get_time", "{}") if "time" in user.lower() else None)
    engines = Engines(asr=load_model(None), tts=load_synthesizer(), lm=lm, load_seconds={})
    config = SessionConfig(generation=spoken_answer(max_new_tokens=32), tools=ToolsConfig())

    async def scenario() -> list:
        async with VoiceServer(engines, config, WebConfig(port=0)) as server, \
                client_for(server.port).realtime.connect(model="voice-assistant") as conn:
            got = await until(conn, "session.created", [])
            sender = asyncio.create_task(stream(conn, padded))
            await until(conn, "response.done", got)
            await sender
        return got

    got = asyncio.run(scenario())
    assert "time is it" in of(got, "conversation.item.input_audio_transcription.completed")[-1].transcript.lower()
    [arguments] = of(got, "response.function_call_arguments.done")
    assert arguments.name == "get_time" and arguments.output_index == 0
    outputs = [e.item for e in of(got, "conversation.item.added") if e.item.type == "function_call_output"]
    assert [o.call_id for o in outputs] == [arguments.call_id] and outputs[0].output
    done = of(got, "response.done")[0].response
    assert [item.type for item in done.output] == ["function_call", "message"]
    spoken = of(got, "response.output_audio_transcript.done")[0].transcript
    assert spoken.startswith("Done:") and outputs[0].output in spoken  # the tool's result, said
    assert of(got, "response.output_audio.delta")[0].output_index == 1


def test_a_client_tool_round_trip(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A tool the client runs itself (session.tools): the model's call ends the response unrun, the client's
    function_call_output comes back by call_id (a wrong one is an error naming item.call_id), and response.create
    gets the spoken answer that says the result. The LM is the scripted tool-capable stand-in (the bundled model
    rarely calls tools); the ASR, the TTS, the server's own tools, the sockets and the official client are real."""
    from model.chat.tools import call_text
    from tests.unit.test_voice_tools import ScriptedLM
    from voice.listen.asr_models import load_model
    from voice.speak.tts import load_synthesizer
    from voice.think.spoken import spoken_answer
    from voice.tools.toolbox import ToolsConfig
    from voice.turn.session import SessionConfig
    from web.server import VoiceServer

    weather = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    lm = ScriptedLM(lambda user: call_text("get_weather", '{"city":"Paris"}') if "weather" in user else None)
    engines = Engines(asr=load_model(None), tts=load_synthesizer(), lm=lm, load_seconds={})
    config = SessionConfig(generation=spoken_answer(max_new_tokens=32), tools=ToolsConfig())  # the server's too

    async def scenario() -> tuple[list, list, list, tuple]:
        async with VoiceServer(engines, config, WebConfig(port=0)) as server, \
                client_for(server.port).realtime.connect(model="voice-assistant") as conn:
            setup = await until(conn, "session.created", [])
            await conn.session.update(session={"type": "realtime", "tools": [  # type: ignore[list-item]
                weather, {"type": "function", "name": "get_time", "parameters": {}}]}, event_id="clash")
            await conn.session.update(session={"type": "realtime", "tools": [weather],  # type: ignore[list-item]
                                               "tool_choice": "auto"})
            await until(conn, "session.updated", setup)
            await conn.conversation.item.create(item={  # type: ignore[arg-type]
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "what is the weather in paris"}]})
            await conn.response.create()
            called = await until(conn, "response.done", [])
            call = of(called, "response.function_call_arguments.done")[0]
            await conn.conversation.item.create(item={"type": "function_call_output", "call_id": "call_wrong",
                                                      "output": "{}"}, event_id="wrong")
            await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                      "output": '{"sky": "sunny", "celsius": 21}'})
            answered = await until(conn, "conversation.item.done", [])
            await conn.response.create()
            await until(conn, "response.done", answered)
            (session,) = server._sessions.values()
            history = tuple(session.dialogue.history)
        return setup, called, answered, history

    setup, called, answered, history = asyncio.run(scenario())
    [clash] = of(setup, "error")
    assert clash.error.event_id == "clash" and clash.error.param == "session.tools" and "get_time" in \
        clash.error.message
    assert [t.name for t in of(setup, "session.updated")[-1].session.tools] == ["get_weather"]

    [call] = of(called, "response.function_call_arguments.done")
    assert call.name == "get_weather" and '"Paris"' in call.arguments
    done = of(called, "response.done")[0].response
    assert done.status == "completed" and [item.type for item in done.output] == ["function_call"]
    assert done.output[0].call_id == call.call_id and done.usage.output_tokens > 0
    assert not of(called, "response.output_audio.delta")  # nothing said, and the call not run by the server:
    assert all(e.item.type != "function_call_output" for e in of(called, "conversation.item.added"))

    [wrong] = of(answered, "error")
    assert wrong.error.event_id == "wrong" and wrong.error.param == "item.call_id"
    [result] = [e.item for e in of(answered, "conversation.item.added") if e.item.type == "function_call_output"]
    assert result.call_id == call.call_id
    spoken = of(answered, "response.output_audio_transcript.done")[0].transcript
    assert spoken.startswith("Done:") and "sunny" in spoken  # the model's words say the client's result
    assert of(answered, "response.output_audio.delta")
    final = of(answered, "response.done")[0].response
    assert final.status == "completed" and [item.type for item in final.output] == ["message"]
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[2].content == '{"sky": "sunny", "celsius": 21}' and "<tool_call>" in history[1].content
    second_messages, _ = lm.requests[-1]
    assert second_messages[-1].role == "tool"  # the answer was written reading the result
