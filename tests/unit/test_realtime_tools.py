"""The client's own function tools through the Realtime protocol core, without sockets: `session.tools` and
`tool_choice` parsed and reported, a call of one becoming the function_call item that ends its response (unrun),
the client's `function_call_output` matched by call id, and `response.create` asking the session to answer it
(every server event checked against the official client's types)."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_realtime_protocol import S, answer, parse, sent, translator, types
from voice import events as ev
from voice.tools.loop import ToolChoice
from web.realtime.actions import AnswerToolResults, SendText, SetTools, ToolOutput
from web.realtime.client_events import CreateToolOutput, RealtimeError, SessionUpdate, parse_client_event

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = {"type": "conversation.item.create", "item": {
    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather in paris?"}]}}


def output(call_id: str, text: str = '{"sky":"sunny"}') -> dict:
    return {"type": "conversation.item.create", "event_id": "out-1",
            "item": {"type": "function_call_output", "call_id": call_id, "output": text}}


def test_session_tools_and_tool_choice_are_parsed_and_reported() -> None:
    event = parse({"type": "session.update", "session": {"tools": [WEATHER], "tool_choice": {
        "type": "function", "name": "get_weather"}}})
    assert isinstance(event, SessionUpdate)
    tools = event.settings.tools
    assert [f.name for f in tools.functions] == ["get_weather"]
    assert tools.choice == ToolChoice("required", function="get_weather")
    t = translator()
    actions = t.client_event(event)
    assert actions[0] == SetTools(tools)  # first: the session may refuse it, and then nothing else happens
    [updated] = sent(actions)
    assert updated["session"]["tools"] == [WEATHER]
    assert updated["session"]["tool_choice"] == {"type": "function", "name": "get_weather"}
    brief = parse_client_event(json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}}),
                               t.settings, 2000)
    assert not any(isinstance(a, SetTools) for a in t.client_event(brief))  # the tools did not change
    assert parse({"type": "session.update", "session": {"tool_choice": "required"}}).settings.tools.choice == \
        ToolChoice("required")


@pytest.mark.parametrize(("tools", "choice", "param"), [
    ([{**WEATHER, "name": "bad name!"}], "auto", "session.tools[0].name"),
    ([WEATHER, WEATHER], "auto", "session.tools[1].name"),
    ([{**WEATHER, "strict": True}], "auto", "session.tools[0].strict"),
    ([{**WEATHER, "parameters": "x"}], "auto", "session.tools[0].parameters"),
    ([WEATHER], {"type": "function", "name": "get_time"}, "session.tool_choice.name"),
    ([WEATHER], "sometimes", "session.tool_choice"),
])
def test_bad_tools_are_refused_naming_the_field(tools: list, choice, param: str) -> None:
    with pytest.raises(RealtimeError) as caught:
        parse({"type": "session.update", "session": {"tools": tools, "tool_choice": choice}})
    assert caught.value.param == param


def test_a_client_tool_call_ends_its_response_then_its_output_is_answered() -> None:
    t = translator()
    t.client_event(parse({"type": "session.update", "session": {"tools": [WEATHER]}}))
    t.client_event(parse(ASK))
    assert t.client_event(parse({"type": "response.create"})) == [SendText("weather in paris?")]
    created = types(t.session_event(ev.LmStarted(session=S, turn=1)))
    assert created == ["response.created"]
    call = sent(t.session_event(ev.ToolRequested(session=S, turn=1, name="get_weather",
                                                 arguments='{"city":"Paris"}', call_id="call_abc")))
    assert [e["type"] for e in call] == [
        "response.output_item.added", "conversation.item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "conversation.item.done"]
    assert call[3] == {**call[3], "name": "get_weather", "arguments": '{"city":"Paris"}', "call_id": "call_abc",
                       "output_index": 0}
    t.session_event(ev.AnswerDone(session=S, turn=1, text="", tokens=9, passes=9, lm_seconds=0.2,
                                  finish_reason="tool_calls", prompt_tokens=120, cached_prompt_tokens=100))
    ended = sent(t.session_event(ev.TurnEnd(session=S, turn=1, user_text="weather in paris?", answer="", spoken="",
                                            interrupted=False, latency_ms={}, stats={})))
    assert [e["type"] for e in ended] == ["response.done"]  # no message: the response ends with the call
    done = ended[0]["response"]
    assert done["status"] == "completed" and [i["type"] for i in done["output"]] == ["function_call"]
    assert done["output"][0]["call_id"] == "call_abc"
    assert done["usage"] == {**done["usage"], "input_tokens": 120, "output_tokens": 9, "total_tokens": 129}
    assert done["usage"]["input_token_details"]["cached_tokens"] == 100

    with pytest.raises(RealtimeError, match="nothing to respond to"):
        t.client_event(parse({"type": "response.create"}))  # no output yet
    with pytest.raises(RealtimeError) as caught:
        t.client_event(parse(output("call_nope")))
    assert (caught.value.param, caught.value.event_id) == ("item.call_id", "out-1")
    event = parse(output("call_abc"))
    assert isinstance(event, CreateToolOutput)
    actions = t.client_event(event)
    assert actions[0] == ToolOutput("call_abc", '{"sky":"sunny"}')
    added = sent(actions)
    assert [e["type"] for e in added] == ["conversation.item.added", "conversation.item.done"]
    assert added[0]["item"]["type"] == "function_call_output" and added[0]["item"]["call_id"] == "call_abc"
    with pytest.raises(RealtimeError):  # answered once
        t.client_event(parse(output("call_abc")))
    assert t.client_event(parse({"type": "response.create"})) == [AnswerToolResults()]
    spoken = sent(answer(t, 2))  # the session's turn that answers it, not held
    assert spoken[0]["type"] == "response.created" and "response.output_audio.delta" in [e["type"] for e in spoken]
    assert spoken[-1]["response"]["status"] == "completed"
    assert [i["type"] for i in spoken[-1]["response"]["output"]] == ["message"]
