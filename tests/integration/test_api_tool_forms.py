"""Tool calls as real models write them, through dlm-serve and the official `openai` client with `tool_choice="auto"`,
streamed and not. The model is scripted (scripts/report_lib/tiny_models.py): it writes a fixed answer token by token
(bytes), in each family's own form, under the server's grammar: where the grammar refuses the scripted token the
model takes the first one it allows, as a real model takes its best allowed one.

A call in any form comes back as `tool_calls` (never as content), text that merely holds JSON comes back as content
unchanged, and a call that attempts an undeclared name or arguments off the schema cannot be produced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from model.chat.engine import DiffusionChatModel
from model.server import ServerConfig
from scripts.report_lib.tiny_models import BYTE_EOS, scripted_byte_model
from tests.integration.api_harness import RunningServer, serve

pytestmark = pytest.mark.timeout(120)


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=12)  # bounded: a refused script fills a string with the first allowed character
    days: int = Field(ge=1, le=7)


class Timer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: int = Field(ge=1, le=3600)


SCHEMAS = {"get_weather": Weather, "set_timer": Timer}
TOOLS: list[Any] = [{"type": "function", "function": {"name": name, "description": name.replace("_", " "),
                                                      "parameters": schema.model_json_schema()}}
                    for name, schema in SCHEMAS.items()]
PARIS = {"city": "Paris", "days": 2}

FORMS = {
    "qwen": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
    "hermes_compact": '<tool_call>{"name":"get_weather","arguments":{"city":"Paris","days":2}}</tool_call>',
    "bare": '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}',
    "fenced": '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n```',
    "llama_bare": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
}
TEXTS = {
    "plain": "It is sunny in Paris today.",
    "json_further_in": 'The call would be {"name": "get_weather", "arguments": {"city": "Paris"}} but it is sunny.',
    "other_object": '{"answer": 42}',
    "code_fence": "```python\nprint('hi')\n```",
}


def scripted(answer: str) -> DiffusionChatModel:
    """The scripted byte model, its end-of-sequence id (256) given a token, which the grammar engine needs to know
    where an answer may end."""
    model = scripted_byte_model(answer)
    model.tokenizer.add_special_tokens({"eos_token": "<eos>"})
    assert model.tokenizer.eos_token_id == BYTE_EOS
    return model


@pytest.fixture
def server(answer: str) -> Iterator[RunningServer]:
    """dlm-serve over a model that writes `answer` (the test's parameter)."""
    with serve(scripted(answer), ServerConfig()) as running:
        yield running


def client_of(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)


def ask(server: RunningServer, **fields: Any) -> Any:
    return client_of(server).chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "Weather in Paris for two days?"}], tools=TOOLS,
        tool_choice="auto", max_tokens=160, **fields)


def streamed(server: RunningServer) -> tuple[str, dict[int, dict[str, str]], str | None]:
    """(content, calls by index assembled from `delta.tool_calls`, finish_reason) of a streamed answer."""
    content, calls, finish = "", {}, None
    for chunk in ask(server, stream=True):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for fragment in choice.delta.tool_calls or ():
            call = calls.setdefault(fragment.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += fragment.id or ""
            call["name"] += (fragment.function.name or "") if fragment.function else ""
            call["arguments"] += (fragment.function.arguments or "") if fragment.function else ""
        finish = choice.finish_reason or finish
    return content, calls, finish


def valid_call(name: str, arguments: str) -> dict[str, Any]:
    """The call's arguments, checked against its function's schema (a name not offered fails here)."""
    return SCHEMAS[name].model_validate_json(arguments).model_dump()


@pytest.mark.parametrize("answer", list(FORMS.values()), ids=list(FORMS))
def test_a_call_in_each_familys_form_comes_back_as_tool_calls(server: RunningServer) -> None:
    answer = ask(server)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == PARIS
    content, calls, finish = streamed(server)
    assert content == "" and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", PARIS)]
    assert calls[0]["id"].startswith("call_")


@pytest.mark.parametrize("answer", list(TEXTS.values()), ids=list(TEXTS))
def test_text_that_does_not_open_with_a_call_is_content_unchanged(server: RunningServer, answer: str) -> None:
    text = answer
    choice = ask(server).choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (text, None, "stop")
    assert streamed(server) == (text, {}, "stop")


@pytest.mark.parametrize("answer", [
    '{"name": "say_hello", "arguments": {}}',
    '{"name": "seventeen_times_twenty_three", "arguments": {"x": 17}}',
    '<tool_call>\n{"name": "get_news", "arguments": {"city": "Paris"}}\n</tool_call>',
], ids=["bare_say_hello", "bare_invented_arithmetic", "qwen_get_news"])
def test_a_call_of_an_undeclared_name_cannot_be_produced(server: RunningServer) -> None:
    for name, arguments, finish in answers(server):
        assert name in SCHEMAS, name  # held to a declared name from the first wrong character on
        if finish == "tool_calls":
            valid_call(name, arguments)


@pytest.mark.parametrize("answer", [
    '{"name": "get_weather", "arguments": {"city": 3, "days": "two"}}',
    '{"name": "set_timer", "arguments": {"type": "object", "properties": {"seconds": {"type": "integer"}}}}',
    '```json\n{"name": "set_timer", "arguments": {"minutes": 5}}\n```',
], ids=["wrong_types", "schema_as_arguments", "undeclared_argument"])
def test_arguments_off_the_schema_cannot_be_produced(server: RunningServer) -> None:
    for name, arguments, finish in answers(server):
        assert finish == "tool_calls", (name, arguments)
        valid_call(name, arguments)


def answers(server: RunningServer) -> list[tuple[str, str, str | None]]:
    """Every call of the answer, non-streamed and streamed (the same calls both ways): (name, arguments,
    finish_reason) each. Parallel calls allowed: a script misaligned by the grammar writes on into more calls, each
    of which must be valid too."""
    choice = ask(server).choices[0]
    calls = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or ()]
    content, deltas, finish = streamed(server)
    assert content == "" and [(c["name"], c["arguments"]) for c in deltas.values()] == calls and calls
    return [(name, arguments, reason) for name, arguments in calls for reason in (choice.finish_reason, finish)]
