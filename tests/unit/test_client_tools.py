"""Tools a client runs itself (a Realtime session's `tools`): the tool loop hands their calls out instead of running
them (voice/tools/loop.py `HandOut`), `tool_choice` shapes the first round's grammar, and the session shell ends the
turn with the call, takes the result back by call id and answers it in a turn of its own (scripted LM, fake voice,
no models)."""

from __future__ import annotations

import asyncio

import pytest

import voice.turn.session as session_module
from model.chat import ChatMessage
from model.chat.tools import ToolCall, call_text, checked_function
from tests.unit.test_session_shell import FakeListen, FakeTTS, started, until
from tests.unit.test_voice_tools import ScriptedLM
from voice.engines import Engines
from voice.errors import ProtocolError, ToolError
from voice.events import AnswerDone, AudioOut, DraftUpdate, Event, ToolCalled, ToolRequested, TurnEnd
from voice.think.spoken import spoken_answer
from voice.tools.builtin import BUILTIN_FUNCTIONS
from voice.tools.loop import COULD_NOT_FINISH, Apologise, ClientTools, HandOut, RunTools, ToolChoice, ToolLoop
from voice.tools.toolbox import ToolsConfig
from voice.turn.session import Session, SessionConfig

WEATHER = checked_function("get_weather", "The weather in a city.",
                           {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
CALL = call_text("get_weather", '{"city":"Paris"}')


def _weather(user: str) -> str | None:
    if "weather" in user:
        return CALL
    if "time" in user:
        return call_text("get_time", "{}")
    return None


# --- the loop's core ----------------------------------------------------------------------------------------------
def test_a_call_of_an_external_function_is_handed_out_and_kept_unanswered() -> None:
    loop = ToolLoop([ChatMessage("user", "weather in paris?")], (*BUILTIN_FUNCTIONS, WEATHER), spoken_answer(),
                    external={"get_weather"})
    assert '"name":"get_weather"' in (loop.options().system_prompt or "")
    decision = loop.answered(CALL)
    assert isinstance(decision, HandOut)
    assert decision.calls == (ToolCall("get_weather", '{"city":"Paris"}', True),)
    [call_id] = decision.call_ids
    assert call_id.startswith("call_")
    loop.handed_out(decision)
    assert loop.added == [ChatMessage("assistant", CALL)] and loop.rounds == 1
    # the session's own tools are still run by the session
    assert isinstance(loop.answered(call_text("get_time", "{}")), RunTools)


def test_a_round_mixing_external_and_own_calls_is_an_apology() -> None:
    loop = ToolLoop([ChatMessage("user", "x")], (*BUILTIN_FUNCTIONS, WEATHER), spoken_answer(),
                    external={"get_weather"})
    assert loop.answered(CALL + call_text("get_time", "{}")) == Apologise(COULD_NOT_FINISH)


@pytest.mark.parametrize(("choice", "names", "required"), [
    (ToolChoice("auto"), ("get_time", "get_weather"), False),
    (ToolChoice("required"), ("get_time", "get_weather"), True),
    (ToolChoice("auto", function="get_weather"), ("get_weather",), True),
    (ToolChoice("none"), None, False),
])
def test_tool_choice_shapes_the_first_round_only(choice: ToolChoice, names, required: bool) -> None:
    time_only = tuple(f for f in BUILTIN_FUNCTIONS if f.name == "get_time")
    loop = ToolLoop([ChatMessage("user", "x")], (*time_only, WEATHER), spoken_answer(), external={"get_weather"},
                    choice=choice)
    first = loop.options()
    if names is None:
        assert first.tools is None
    else:
        assert first.tools is not None and tuple(name for name, _ in first.tools.tools) == names
        assert first.tools.required is required
    assert '"name":"get_weather"' in (first.system_prompt or "")  # offered whatever the choice: the cache holds
    loop.results([ToolCall("get_time", "{}", True)], ["It is noon."])
    after = loop.options()
    assert after.tools is not None and not after.tools.required and len(after.tools.tools) == 2
    assert after.system_prompt == first.system_prompt


# --- the session shell ----------------------------------------------------------------------------------------------
@pytest.fixture
def tool_session(monkeypatch: pytest.MonkeyPatch):
    """A session with the built-in tools, a scripted LM and a fake voice."""
    monkeypatch.setattr(session_module, "ListenStage", FakeListen)

    def make(lm: ScriptedLM) -> Session:
        engines = Engines(asr=None, tts=FakeTTS(), lm=lm, load_seconds={})  # type: ignore[arg-type]
        config = SessionConfig(generation=spoken_answer(max_new_tokens=32), tools=ToolsConfig(),
                               wait_for_playback=False)
        return Session(engines, config)

    return make


def test_a_client_tool_call_ends_the_turn_and_its_result_is_answered_in_a_turn_of_its_own(tool_session) -> None:
    async def scenario() -> tuple[ScriptedLM, list[Event], list, list]:
        lm = ScriptedLM(_weather)
        session = tool_session(lm)
        session.set_client_tools(ClientTools((WEATHER,)))
        _, events, collector = await started(session)
        await session.send_text("what is the weather in paris")
        await until(lambda: any(isinstance(e, TurnEnd) for e in events))
        [requested] = [e for e in events if isinstance(e, ToolRequested)]
        with pytest.raises(ProtocolError, match="call_nope"):
            session.add_tool_result("call_nope", "sunny")
        session.add_tool_result(requested.call_id, "sunny, 21 C")
        with pytest.raises(ProtocolError):  # answered once
            session.add_tool_result(requested.call_id, "again")
        after_result = list(session.dialogue.history)
        await session.answer_tool_results()
        await until(lambda: sum(isinstance(e, TurnEnd) for e in events) == 2)
        history = list(session.dialogue.history)
        await session.close()
        await collector
        return lm, events, after_result, history

    lm, events, after_result, history = asyncio.run(scenario())
    [requested] = [e for e in events if isinstance(e, ToolRequested)]
    assert requested.name == "get_weather" and requested.arguments == '{"city":"Paris"}'
    assert not any(isinstance(e, ToolCalled) for e in events)  # never run by the session
    first, second = [e for e in events if isinstance(e, TurnEnd)]
    assert first.answer == "" and first.spoken == "" and not first.interrupted
    assert not any(isinstance(e, AudioOut) and e.turn == first.turn for e in events)  # nothing said
    assert "<tool_call>" not in "".join(e.draft for e in events if isinstance(e, DraftUpdate))
    done = [e for e in events if isinstance(e, AnswerDone)]
    assert done[0].finish_reason == "tool_calls" and done[0].tokens == 1  # the call's tokens count
    assert after_result == [ChatMessage("user", "what is the weather in paris"), ChatMessage("assistant", CALL),
                            ChatMessage("tool", "sunny, 21 C")]
    assert second.user_text == "" and second.answer == "Done: sunny, 21 C" and second.spoken == second.answer
    assert history == [*after_result, ChatMessage("assistant", "Done: sunny, 21 C")]
    (_, first_options), (second_messages, second_options) = lm.requests
    assert first_options.tools is not None and '"name":"get_weather"' in (first_options.system_prompt or "")
    assert second_messages == after_result and second_options.system_prompt == first_options.system_prompt


def test_a_client_tool_named_as_a_server_tool_is_refused_by_name(tool_session) -> None:
    session = tool_session(ScriptedLM(_weather))
    clash = checked_function("get_time", "mine", {"type": "object", "properties": {}})
    with pytest.raises(ToolError, match="get_time"):
        session.set_client_tools(ClientTools((WEATHER, clash)))
    assert session._answers.client_tools == ClientTools()  # a refused offer changes nothing


def test_a_result_returned_while_an_answer_runs_joins_the_history_after_its_turn(tool_session) -> None:
    async def scenario() -> list:
        session = tool_session(ScriptedLM(_weather))
        session.set_client_tools(ClientTools((WEATHER,)))
        _, events, collector = await started(session)
        await session.send_text("what is the weather in paris")
        await until(lambda: any(isinstance(e, ToolRequested) for e in events))
        [requested] = [e for e in events if isinstance(e, ToolRequested)]
        session.add_tool_result(requested.call_id, "rain")  # maybe before the turn that called has ended
        await until(lambda: any(isinstance(e, TurnEnd) for e in events))
        await session.close()
        await collector
        return list(session.dialogue.history)

    history = asyncio.run(scenario())
    assert [m.role for m in history] == ["user", "assistant", "tool"] and history[-1].content == "rain"
