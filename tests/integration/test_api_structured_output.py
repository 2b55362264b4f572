"""`response_format` through dlm-serve on the bundled model: the official client's `parse` gets an object of its
pydantic model in every decoding mode (diffusion commits left to right under the grammar), `json_object` gives a JSON
object, and what the grammar engine cannot enforce (a malformed schema) is a 400 naming `response_format`."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from pydantic import BaseModel, Field

from model.chat import ChatMessage, GenerationOptions
from model.chat.client import OpenAIChatModel
from model.chat.engine import DiffusionChatModel
from model.decoding.grammar import response_format
from model.loading import load_chat_model
from model.server.config import ServerConfig
from tests.integration.api_harness import RunningServer, serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAME = "smollm2-135m-block-diffusion"
PROMPTS = (Path(__file__).parents[1] / "data" / "heldout_prompts.txt").read_text(encoding="utf-8").splitlines()[:3]


class Reply(BaseModel):
    answer: str = Field(max_length=60)  # bounded, so the JSON closes within a small max_tokens
    happy: bool


@pytest.fixture(scope="module")
def bundled() -> DiffusionChatModel:
    chat = load_chat_model(None)
    assert isinstance(chat, DiffusionChatModel) and chat.sampler.decoding == "self-speculative"
    return chat


def same_model_decoding(chat: DiffusionChatModel, decoding: str) -> DiffusionChatModel:
    """The bundled model (same weights, same back end) decoding in another mode."""
    sampler = dataclasses.replace(chat.sampler, decoding=decoding)
    return DiffusionChatModel(chat.name, chat.tokenizer, chat.backend, sampler, chat.system_prompt,
                              chat.context_length)


@pytest.fixture(scope="module", params=["self-speculative", "autoregressive", "diffusion"])
def server(request: pytest.FixtureRequest, bundled: DiffusionChatModel) -> Iterator[RunningServer]:
    model = bundled if request.param == "self-speculative" else same_model_decoding(bundled, request.param)
    with serve(model, ServerConfig()) as running:
        yield running


def client_of(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0)


def test_parse_returns_the_pydantic_object(server: RunningServer) -> None:
    client = client_of(server)
    for prompt in PROMPTS:
        completion = client.chat.completions.parse(
            model=NAME, messages=[{"role": "user", "content": prompt}], response_format=Reply, max_tokens=64,
            temperature=0.0,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Reply), choice.message.content


def test_the_remote_client_passes_the_response_format_on(server: RunningServer) -> None:
    """`--llm-url`: a voice worker's `OpenAIChatModel` asks the remote server for the same structure."""
    remote = OpenAIChatModel(server.api_url, NAME)
    options = GenerationOptions(max_new_tokens=64, response_format=response_format(
        "json_schema", Reply.model_json_schema(), "Reply"))
    drafts = list(remote.stream_chat([ChatMessage("user", PROMPTS[0])], options))
    assert drafts[-1].finish_reason == "stop"
    Reply.model_validate_json(drafts[-1].text)


def test_json_object_is_a_json_object(server: RunningServer) -> None:
    reply = client_of(server).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Describe a cat in JSON."}], max_tokens=48,
        response_format={"type": "json_object"}, stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in reply if chunk.choices)
    assert text.startswith("{")
    try:
        assert isinstance(json.loads(text), dict)
    except json.JSONDecodeError:  # the budget may end inside an open string; never outside the grammar
        assert len(text) > 20, text


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "object", "properties": {"a": {"type": "strin"}}}, "strin"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"a": {"type": "string", "maxLenght": 3}}}, "maxLenght"),
])
def test_a_schema_the_engine_cannot_enforce_is_a_400_naming_it(server: RunningServer, schema: dict,
                                                              words: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client_of(server).chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "response_format.json_schema.schema", error
    assert words in error["message"], error
