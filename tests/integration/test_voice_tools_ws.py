"""Tools through the browser protocol with real speech: Whisper tiny.en hears a question spoken by the Piper voice
over the WebSocket, the session runs the tool the model called, and Piper speaks the answer; a timer set by a typed
turn is spoken when due, between turns; an MCP server's tool (tests/data/mcp_toy_server.py) is called.

The bundled 135M model almost never calls a tool (scripts/bench/bench_tool_choice.py), so the LM here is the scripted
stand-in of a tool-capable model (tests/unit/test_voice_tools.py `ScriptedLM`): what is tested is everything around
it, real ASR, TTS, server, socket, tools and MCP server."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from model.chat.tools import call_text
from tests.integration.test_voice_mcp import toy_command
from tests.integration.ws_harness import Received, collect, speech_pcm16
from tests.unit.test_voice_tools import ScriptedLM
from voice.audio import stream_pcm16
from voice.engines import Engines
from voice.think.spoken import spoken_answer
from voice.tools.timers import spoken_now
from voice.tools.toolbox import ToolsConfig
from voice.turn.session import SessionConfig
from web.config import WebConfig
from web.server import VoiceServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def calls(user: str) -> str | None:
    text = user.lower()
    if "timer" in text:
        return call_text("set_timer", '{"seconds":2}')
    if "time" in text:
        return call_text("get_time", "{}")
    if text.startswith("shout"):
        return call_text("shout", json.dumps({"text": text.removeprefix("shout").strip(" .!")}))
    return None


@pytest.fixture(scope="module")
def question_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scripts.report_lib.inputs import synthesised_questions

    [path] = synthesised_questions(tmp_path_factory.mktemp("speech"), ("What time is it?",))
    return path


def test_time_timer_and_mcp_tools_over_the_websocket(question_clip: Path, tmp_path: Path) -> None:
    from voice.listen.asr_models import load_model
    from voice.speak.tts import load_synthesizer

    engines = Engines(asr=load_model(None), tts=load_synthesizer(), lm=ScriptedLM(calls), load_seconds={})
    config = SessionConfig(generation=spoken_answer(max_new_tokens=32),
                           tools=ToolsConfig(mcp=(toy_command(tmp_path / "starts"),)))

    async def scenario() -> tuple[Received, Received, Received, Received, set[str]]:
        async with VoiceServer(engines, config, WebConfig(port=0)) as server, \
                connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            spoken = Received()
            await collect(ws, spoken, until="ready")
            before = spoken_now(dt.datetime.now().astimezone())
            await stream_pcm16(ws.send, speech_pcm16(path=question_clip), realtime=True)
            await collect(ws, spoken, until="turn_end")
            after = spoken_now(dt.datetime.now().astimezone())

            timer = Received()
            await ws.send(json.dumps({"type": "text", "text": "set a timer for two seconds"}))
            await collect(ws, timer, until="turn_end")
            announced = Received()
            await collect(ws, announced, until="turn_end", timeout_s=20)  # nobody speaks: said when due

            mcp = Received()
            await ws.send(json.dumps({"type": "text", "text": "shout hello"}))
            await collect(ws, mcp, until="turn_end")
        return spoken, timer, announced, mcp, {before, after}

    spoken, timer, announced, mcp, now = asyncio.run(scenario())
    [final] = [m for m in spoken.of_type("transcript") if m["final"]]
    assert "time is it" in final["text"].lower()
    [answer] = spoken.of_type("answer")
    assert answer["text"].removeprefix("Done: ") in now  # the machine's own time and date, its zone
    assert spoken.audio_bytes > 0
    every_draft = [m["draft"] for r in (spoken, timer, mcp) for m in r.of_type("draft")]
    assert every_draft and not any("<tool_call>" in draft for draft in every_draft)  # never shown, never spoken

    assert timer.of_type("answer")[0]["text"] == "Done: Timer set for 2 seconds."
    end = announced.of_type("turn_end")[0]
    assert end["answer"] == "Your timer for 2 seconds is done." and end["user_text"] == ""
    assert end["stats"]["announcement"] == 1 and announced.audio_bytes > 0
    assert announced.of_type("audio_start") and announced.of_type("audio_end")

    assert mcp.of_type("answer")[0]["text"] == "Done: HELLO!"
    assert mcp.of_type("turn_end")[0]["stats"]["tool_calls"] == 1
