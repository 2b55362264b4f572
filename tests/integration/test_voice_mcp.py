"""MCP tools in the voice session: a real stdio MCP server (tests/data/mcp_toy_server.py, the `mcp` SDK's server)
started by the session's toolbox, its tools listed with their schemas and called; a server that dies mid-call is an
apology, and the next turn starts it again. No models: the LM is the scripted one of tests/unit/test_voice_tools.py
and the voice a fake, so these run in seconds (the browser-protocol test with real speech is
tests/integration/test_voice_tools_ws.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from model.chat.tools import call_text
from tests.unit.test_session_shell import FakeListen, FakeTTS, started
from tests.unit.test_voice_tools import ScriptedLM, _turn
from voice.engines import Engines
from voice.errors import ToolError
from voice.events import DraftUpdate, Event, ToolCalled, TurnEnd
from voice.think.spoken import spoken_answer
from voice.tools.toolbox import Toolbox, ToolsConfig
from voice.turn.session import Session, SessionConfig

TOY_SERVER = Path(__file__).resolve().parents[1] / "data" / "mcp_toy_server.py"

pytestmark = pytest.mark.timeout(120)


def toy_command(starts: Path) -> str:
    return shlex.join([sys.executable, str(TOY_SERVER), str(starts)])


def mcp_calls(user: str) -> str | None:
    """The stand-in for a tool-capable model: "slowly shout X", "shout X", "crash"."""
    words = user.lower().rstrip(".!?").split()
    if words[:2] == ["slowly", "shout"]:
        return call_text("slow_shout", json.dumps({"text": " ".join(words[2:])}))
    if words[:1] == ["shout"]:
        return call_text("shout", json.dumps({"text": " ".join(words[1:])}))
    if words == ["crash"]:
        return call_text("crash", "{}")
    return None


def test_the_toolbox_lists_calls_and_restarts_an_mcp_server(tmp_path: Path) -> None:
    starts = tmp_path / "starts"

    async def scenario() -> tuple[dict[str, str], str, str]:
        toolbox = Toolbox(ToolsConfig(builtins=False, mcp=(toy_command(starts),)))
        try:
            schemas = {f.name: f.parameters for f in await toolbox.functions()}
            loud = await toolbox.call("shout", '{"text":"hi"}')
            with pytest.raises(ToolError, match="the crash tool stopped working"):
                await toolbox.call("crash", "{}")
            with pytest.raises(ToolError, match="not available right now"):
                await toolbox.call("shout", '{"text":"hi"}')  # down until the next turn
            await toolbox.functions()  # the next turn: started again
            again = await toolbox.call("shout", '{"text":"again"}')
        finally:
            await toolbox.close()
        return schemas, loud, again

    schemas, loud, again = asyncio.run(scenario())
    assert set(schemas) == {"shout", "slow_shout", "crash"}  # not `tag`: a schema the grammar engine refuses
    assert json.loads(schemas["shout"])["properties"]["text"]["type"] == "string"
    assert json.loads(schemas["shout"])["required"] == ["text"]
    assert (loud, again) == ("HI!", "AGAIN!")
    assert len(starts.read_text().split()) == 2  # one restart


def test_a_session_calls_mcp_tools_and_apologises_when_the_server_dies(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import voice.turn.session as session_module

    monkeypatch.setattr(session_module, "ListenStage", FakeListen)
    starts = tmp_path / "starts"
    lm = ScriptedLM(mcp_calls)

    async def scenario() -> tuple[list[Event], list[TurnEnd]]:
        engines = Engines(asr=None, tts=FakeTTS(), lm=lm, load_seconds={})  # type: ignore[arg-type]
        config = SessionConfig(generation=spoken_answer(max_new_tokens=32), wait_for_playback=False,
                               tools=ToolsConfig(builtins=False, mcp=(toy_command(starts),)))
        session = Session(engines, config)
        _, events, collector = await started(session)
        ends = [await _turn(session, events, text) for text in
                ("shout hello", "slowly shout wait", "crash", "shout still here", "just chat")]
        await session.close()
        await collector
        return events, ends

    events, ends = asyncio.run(scenario())
    assert [end.answer for end in ends] == [
        "Done: HELLO!", "Done: WAIT!", "Sorry, the crash tool stopped working.", "Done: STILL HERE!", "Just words."]
    slow_drafts = [e for e in events if isinstance(e, DraftUpdate) and e.turn == ends[1].turn]
    assert slow_drafts[-1].committed == "One moment. Done: WAIT!"
    assert [(e.name, bool(e.error)) for e in events if isinstance(e, ToolCalled)] == [
        ("shout", False), ("slow_shout", False), ("crash", True), ("shout", False)]
    assert len(starts.read_text().split()) == 2  # the turn after the crash started the server again
    first_prompt = lm.requests[0][1].system_prompt or ""
    assert '"name":"shout"' in first_prompt and '"required":["text"]' in first_prompt
    for pid in map(int, starts.read_text().split()):  # closing the session stopped its server
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
