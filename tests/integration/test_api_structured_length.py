"""Structured output on a model that loops inside a string (the bundled 135M does on about half of open questions):
the answer runs to `max_tokens` and says `finish_reason: "length"`, as OpenAI's does, streamed and not; an answer
that closes its JSON says "stop". The model is scripted (tests/integration/test_api_tool_forms.py `scripted`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from model.server import ServerConfig
from tests.integration.api_harness import RunningServer, serve
from tests.integration.test_api_tool_forms import client_of, scripted

pytestmark = pytest.mark.timeout(120)

SCHEMA = {"type": "object", "properties": {"reply": {"type": "string"}}, "required": ["reply"],
          "additionalProperties": False}
FORMATS: list[Any] = [{"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}},
                      {"type": "json_object"}]
LOOPING = '{"reply":"' + "la " * 60


@pytest.fixture
def server(answer: str) -> Iterator[RunningServer]:
    with serve(scripted(answer), ServerConfig()) as running:
        yield running


def both_ways(server: RunningServer, response_format: Any) -> list[tuple[str, str | None]]:
    """(content, finish_reason) of the answer, non-streamed and streamed."""
    client = client_of(server)
    request: Any = {"model": "scripted", "messages": [{"role": "user", "content": "Say something."}],
                    "response_format": response_format, "max_tokens": 20}
    choice = client.chat.completions.create(**request).choices[0]
    content, finish = "", None
    for chunk in client.chat.completions.create(**request, stream=True):
        content += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    return [(choice.message.content or "", choice.finish_reason), (content, finish)]


@pytest.mark.parametrize("response_format", FORMATS, ids=["json_schema", "json_object"])
@pytest.mark.parametrize("answer", [LOOPING])
def test_an_answer_looping_in_a_string_ends_with_length(server: RunningServer, response_format: Any) -> None:
    assert both_ways(server, response_format) == [(LOOPING[:20], "length")] * 2


@pytest.mark.parametrize("response_format", FORMATS, ids=["json_schema", "json_object"])
@pytest.mark.parametrize("answer", ['{"reply":"ok"}'])
def test_an_answer_that_closes_its_json_ends_with_stop(server: RunningServer, response_format: Any) -> None:
    assert both_ways(server, response_format) == [('{"reply":"ok"}', "stop")] * 2
