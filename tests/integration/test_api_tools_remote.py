"""Tools through `--llm-url`: a `dlm-serve` process serving the bundled model (the remote, which enforces the calls
with its own grammar) behind a second API whose model is the remote client (`OpenAIChatModel`), both on loopback,
driven by the official `openai` client; and the voice session's tool loop asking the remote directly.

A call made through the hop is the call the remote makes when asked directly (greedy, same model): the client passes
`tools`, `tool_choice` and `parallel_tool_calls` on and reads the streamed `delta.tool_calls` back into the same call.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from model.chat import ChatMessage, GenerationOptions
from model.chat.client import OpenAIChatModel
from model.chat.tools import Function, constraint, read_calls
from model.server.config import ServerConfig
from scripts.report_lib.local_service import free_port
from tests.integration.api_harness import RunningServer, serve, start_lm_service
from tests.integration.test_api_tools import ARGUMENTS, PROMPTS, TOOLS, valid_call
from voice.tools.loop import RunTools, ToolLoop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAME = "remote-lm"


# The shared test machine may run a pass in seconds, and a tool-call stream is silent until the call's name is
# committed: more patience than a voice turn's READ_TIMEOUT_S
PATIENCE_S = 120.0


@pytest.fixture(scope="module")
def remote_url() -> Iterator[str]:
    port = free_port()
    process = start_lm_service(port, NAME)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        ask(url, PROMPTS[0], tool_choice="required", max_tokens=4)  # warm: the grammar's view of the tokenizer
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def front(remote_url: str) -> Iterator[RunningServer]:
    """An API over the remote client: what `--llm-url` puts in front of any OpenAI-compatible server."""
    remote = OpenAIChatModel(remote_url, NAME, timeout_s=PATIENCE_S)
    with serve(remote, ServerConfig(model_names=(NAME,))) as running:
        yield running


def ask(base_url: str, prompt: str, **fields: Any) -> Any:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    fields = {"max_tokens": 64, **fields}
    return client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": prompt}], tools=TOOLS, temperature=0.0, **fields)


def calls_of(choice: Any) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or ()]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_call_through_the_hop_is_the_remotes_own(front: RunningServer, remote_url: str, tool_choice: Any) -> None:
    through = ask(front.api_url, PROMPTS[0], tool_choice=tool_choice, parallel_tool_calls=False).choices[0]
    direct = ask(remote_url, PROMPTS[0], tool_choice=tool_choice, parallel_tool_calls=False).choices[0]
    assert through.finish_reason == direct.finish_reason == "tool_calls", through.message
    assert calls_of(through) == calls_of(direct) and len(calls_of(through)) == 1
    valid_call(through.message.tool_calls[0], {"get_time"} if isinstance(tool_choice, dict) else set(ARGUMENTS))


def test_a_call_cut_by_max_tokens_is_left_out_as_the_remote_leaves_it(front: RunningServer, remote_url: str) -> None:
    through = ask(front.api_url, PROMPTS[1], tool_choice="required", max_tokens=8)
    direct = ask(remote_url, PROMPTS[1], tool_choice="required", max_tokens=8)
    for completion in (through, direct):
        choice = completion.choices[0]
        assert choice.finish_reason == "length" and not choice.message.tool_calls, choice.message


def test_the_official_stream_helper_assembles_the_call_through_the_hop(front: RunningServer) -> None:
    whole = ask(front.api_url, PROMPTS[2], tool_choice="required").choices[0]
    client = openai.OpenAI(base_url=front.api_url, api_key="unused", max_retries=0)
    with client.chat.completions.stream(
        model=NAME, messages=[{"role": "user", "content": PROMPTS[2]}], tools=TOOLS, max_tokens=64,
        tool_choice="required", temperature=0.0,
    ) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    assert calls_of(final) == calls_of(whole)


def test_a_tool_result_goes_back_and_is_answered_with_text(front: RunningServer, remote_url: str) -> None:
    messages: list[Any] = [
        {"role": "user", "content": PROMPTS[0]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": '{"temperature":18,"sky":"sunny"}'},
    ]
    answers = []
    for url in (front.api_url, remote_url):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        answers.append(client.chat.completions.create(
            model=NAME, messages=messages, tools=TOOLS, max_tokens=32, temperature=0.0).choices[0])
    assert not answers[0].message.tool_calls and answers[0].message.content, answers[0].message
    assert answers[0].message.content == answers[1].message.content  # the same chat reached the remote


def test_the_voice_tool_loop_calls_and_answers_through_the_remote(remote_url: str) -> None:
    """The session's loop (voice/tools/loop.py) with a remote model: the offer in the system prompt and the calls
    in the history travel as OpenAI's tools and tool_calls, and the call comes back as the loop reads it."""
    functions = [Function(t["function"]["name"], t["function"]["description"],
                          json.dumps(t["function"]["parameters"], separators=(",", ":"))) for t in TOOLS]
    loop = ToolLoop([ChatMessage("user", PROMPTS[1])], functions,
                    GenerationOptions(max_new_tokens=64, system_prompt="Reply briefly."), max_rounds=1)
    remote = OpenAIChatModel(remote_url, NAME, timeout_s=PATIENCE_S)
    assert remote.constrains_answers  # so a session offers it its tools
    forced = dataclasses.replace(loop.options(), tools=constraint(functions, required=True, parallel=False))
    drafts = list(remote.stream_chat(loop.messages, forced))
    assert not any(piece.committed for draft in drafts[:-1] for piece in draft.pieces)  # a call is committed whole
    decision = loop.answered(drafts[-1].text)
    assert isinstance(decision, RunTools) and len(decision.calls) == 1, drafts[-1].text
    call = decision.calls[0]
    ARGUMENTS[call.name].model_validate_json(call.arguments)
    assert read_calls(drafts[-1].text) == [call]
    assert loop.results(decision.calls, ["It is 12:30 in Tokyo."]) is None
    assert loop.options().tools is None  # the last round: offered, no call allowed (tool_choice "none")
    answer = list(remote.stream_chat(loop.messages, loop.options()))[-1]
    # the remote saw the chat a client sends with OpenAI's own structure: the same answer
    client = openai.OpenAI(base_url=remote_url, api_key="unused", max_retries=0)
    direct = client.chat.completions.create(model=NAME, max_tokens=64, temperature=0.0, tools=TOOLS,
                                            tool_choice="none", messages=[
        {"role": "system", "content": "Reply briefly."}, {"role": "user", "content": PROMPTS[1]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": "c", "content": "It is 12:30 in Tokyo."}]).choices[0]
    assert answer.finish_reason == direct.finish_reason and answer.text == direct.message.content, answer.text
