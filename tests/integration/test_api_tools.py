"""Tool calls through dlm-serve on the bundled model with the official `openai` client: `tool_choice` "required" and
a named function always give a valid call (its arguments parse and match the function's schema), a streamed call
assembled from its deltas equals the non-streamed one, a tool's result is answered with text, self-speculative
decoding equals constrained autoregressive decoding, diffusion decoding's calls are valid too, and bad tool input is a
400 naming the field."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.chat.tools import starts_calls
from model.decoding.options import ToolConstraint
from model.loading import load_chat_model
from model.server.config import ServerConfig
from tests.integration.api_harness import RunningServer, serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAME = "smollm2-135m-block-diffusion"
PROMPTS = ("What's the weather like in Paris today?", "What time is it in Tokyo right now?",
           "Should I take an umbrella in London tomorrow?")


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=30)  # bounded, so the call closes within a small max_tokens
    unit: Literal["celsius", "fahrenheit"]


class Time(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timezone: str = Field(max_length=30)


ARGUMENTS = {"get_weather": Weather, "get_time": Time}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": Weather.model_json_schema()}},
    {"type": "function", "function": {"name": "get_time", "description": "The current time in a time zone",
                                      "parameters": Time.model_json_schema()}},
]


@pytest.fixture(scope="module")
def bundled() -> DiffusionChatModel:
    chat = load_chat_model(None)
    assert isinstance(chat, DiffusionChatModel) and chat.sampler.decoding == "self-speculative"
    return chat


@pytest.fixture(scope="module")
def server(bundled: DiffusionChatModel) -> Iterator[RunningServer]:
    with serve(bundled, ServerConfig()) as running:
        yield running


def client_of(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)


def ask(server: RunningServer, prompt: str, **fields: Any) -> Any:
    return client_of(server).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": prompt}], tools=TOOLS, max_tokens=64, temperature=0.0,
        **fields)


def valid_call(call: Any, names: set[str]) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    ARGUMENTS[call.function.name].model_validate_json(call.function.arguments)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_required_gives_a_valid_call(server: RunningServer, prompt: str) -> None:
    choice = ask(server, prompt, tool_choice="required", parallel_tool_calls=False).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice.message
    assert len(choice.message.tool_calls) == 1
    valid_call(choice.message.tool_calls[0], set(ARGUMENTS))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_named_function_is_the_one_called(server: RunningServer, prompt: str) -> None:
    choice = ask(server, prompt, tool_choice={"type": "function", "function": {"name": "get_time"}}).choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    for call in choice.message.tool_calls:
        valid_call(call, {"get_time"})


def test_a_streamed_call_assembled_from_deltas_equals_the_answer(server: RunningServer) -> None:
    whole = ask(server, PROMPTS[0], tool_choice="required").choices[0]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in ask(server, PROMPTS[0], tool_choice="required", stream=True):
        if not chunk.choices:
            continue
        assert not chunk.choices[0].delta.content
        for fragment in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(fragment.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += fragment.id or ""
            call["name"] += fragment.function.name or ""
            call["arguments"] += fragment.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole.finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls.values())


@pytest.mark.parametrize("tool_choice", ["auto", "none"])
def test_a_tool_result_is_answered_with_text(server: RunningServer, tool_choice: str) -> None:
    messages: list[Any] = [
        {"role": "user", "content": PROMPTS[0]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature":18,"sky":"sunny"}'},
    ]
    choice = client_of(server).chat.completions.create(
        model=NAME, messages=messages, tools=TOOLS, tool_choice=tool_choice, max_tokens=32).choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls, choice.message
    assert choice.message.content and not choice.message.content.startswith("<")


@pytest.mark.parametrize("required", [True, False], ids=["required", "auto"])
def test_self_speculative_equals_constrained_autoregressive(bundled: DiffusionChatModel, required: bool) -> None:
    """In "auto" the grammar is dormant until a call's trigger: verification rows are masked all the same."""
    autoregressive = DiffusionChatModel(bundled.name, bundled.tokenizer, bundled.backend,
                                        dataclasses.replace(bundled.sampler, decoding="autoregressive"),
                                        bundled.system_prompt, bundled.context_length)
    tools = tuple((t["function"]["name"], json.dumps(t["function"]["parameters"], separators=(",", ":")))
                  for t in TOOLS)
    options = GenerationOptions(max_new_tokens=48, tools=ToolConstraint(tools, required=required))
    for prompt in PROMPTS if not required else PROMPTS[1:2]:
        chat = [ChatMessage("user", prompt)]
        answers = [list(model.stream_chat(chat, options))[-1].text for model in (bundled, autoregressive)]
        assert answers[0] == answers[1], answers
        assert starts_calls(answers[0]) or not required, answers


def test_diffusion_decoding_gives_valid_calls_too(bundled: DiffusionChatModel) -> None:
    """Diffusion commits left to right under the tool grammar (model/decoding/sampler.py)."""
    diffusion = DiffusionChatModel(bundled.name, bundled.tokenizer, bundled.backend,
                                   dataclasses.replace(bundled.sampler, decoding="diffusion"),
                                   bundled.system_prompt, bundled.context_length)
    with serve(diffusion, ServerConfig()) as running:
        for prompt in PROMPTS:
            choice = ask(running, prompt, tool_choice="required").choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice.message
            for call in choice.message.tool_calls:
                valid_call(call, set(ARGUMENTS))


def bad_request(server: RunningServer, **fields: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                               "tools": TOOLS, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client_of(server).chat.completions.create(**request)
    error = caught.value.body
    assert isinstance(error, dict), error
    return error


def test_an_unknown_tool_choice_is_a_400(server: RunningServer) -> None:
    error = bad_request(server, tool_choice="sometimes")
    assert error["param"] == "tool_choice" and "sometimes" in error["message"], error


def test_an_unknown_function_name_is_a_400(server: RunningServer) -> None:
    error = bad_request(server, tool_choice={"type": "function", "function": {"name": "get_news"}})
    assert error["param"] == "tool_choice.function.name" and "get_news" in error["message"], error


def test_a_result_for_an_unknown_call_is_a_400(server: RunningServer) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "tool", "tool_call_id": "call_x", "content": "18 C"}]
    error = bad_request(server, messages=messages)
    assert error["param"] == "messages.1.tool_call_id" and "call_x" in error["message"], error


def test_a_malformed_parameters_schema_is_a_400(server: RunningServer) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]
    error = bad_request(server, tools=tools)
    assert error["param"] == "tools.0.function.parameters" and "objekt" in error["message"], error


def test_duplicate_tool_names_are_a_400(server: RunningServer) -> None:
    error = bad_request(server, tools=[TOOLS[0], TOOLS[0]])
    assert error["param"] == "tools.1.function.name", error


def test_the_official_stream_helper_assembles_the_call(server: RunningServer) -> None:
    whole = ask(server, PROMPTS[2], tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
    with client_of(server).chat.completions.stream(
        model=NAME, messages=[{"role": "user", "content": PROMPTS[2]}], tools=TOOLS, max_tokens=64,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0.0,
    ) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
