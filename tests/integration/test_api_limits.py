"""dlm-serve keeps its promises: refusals are HTTP errors before any work, committed text is final in both stream
formats, finish_reason and usage say what was returned. The model is scripted (scripts/report_lib/tiny_models.py): a
byte tokenizer, so prompt lengths in tokens are exact and "é" is two tokens, and a fixed answer written one token per
pass.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence

import httpx
import openai
import pytest

from model.chat import ChatMessage, ChatModel, Draft, GenerationOptions
from model.errors import ModelError
from model.server import ServerConfig
from scripts.report_lib.tiny_models import scripted_byte_model
from tests.integration.api_harness import PacedModel, RunningServer, serve

pytestmark = pytest.mark.timeout(120)

ANSWER = "Café au lait. Très bien!"  # "é" is tokens 3 and 4: it straddles the end of the first block of 4
SMOLLM2_CONTEXT = 8192  # the bundled model's base: the server's own cap (4096 by default) is the smaller limit


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve(scripted_byte_model(ANSWER, context_length=SMOLLM2_CONTEXT), ServerConfig()) as running:
        yield running


def post(server: RunningServer, **body: object) -> httpx.Response:
    payload = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, **body}
    return httpx.post(f"{server.api_url}/chat/completions", json=payload, timeout=60)


def error_of(response: httpx.Response) -> dict:
    payload = response.json()
    assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}
    return payload["error"]


def sse_events(server: RunningServer, **body: object) -> tuple[int, list[str]]:
    payload = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
               "stream": True, **body}
    with httpx.stream("POST", f"{server.api_url}/chat/completions", json=payload, timeout=60) as response:
        return response.status_code, [line[6:] for line in response.iter_lines() if line]


@pytest.mark.parametrize("stream", [False, True])
def test_a_6000_token_prompt_under_the_character_cap_is_refused_before_any_work(
    server: RunningServer, stream: bool
) -> None:
    submitted = server.scheduler.stats.submitted
    prompt = "word " * 1200  # 6,000 characters (under the 32,000 cap), 6,000+ tokens with this tokenizer
    response = post(server, messages=[{"role": "user", "content": prompt}], stream=stream)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    assert error["param"] == "messages" and "maximum context length is 4096 tokens" in error["message"]
    assert server.scheduler.stats.submitted == submitted  # nothing was queued
    client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": prompt}])
    assert raised.value.code == "context_length_exceeded"
    reply = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == ANSWER  # the next request is answered


def test_the_models_own_context_is_the_limit_when_it_is_smaller() -> None:
    with serve(scripted_byte_model(ANSWER, context_length=64), ServerConfig()) as small:
        too_long = post(small, messages=[{"role": "user", "content": "x" * 40}], max_tokens=8)
        assert too_long.status_code == 400
        assert "maximum context length is 64 tokens" in error_of(too_long)["message"]
        assert post(small, max_tokens=8).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_chat_is_an_http_error_not_an_event_in_a_200(server: RunningServer, stream: bool) -> None:
    response = post(server, messages=[{"role": "user", "content": "   "}], stream=stream)
    assert response.status_code == 400
    assert "empty" in error_of(response)["message"]


class Refusing:
    """A model that tokenizes on its own (like a remote endpoint) and refuses when asked to answer."""

    name = "scripted"

    def stream_chat(
        self, messages: Sequence[ChatMessage], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Draft]:
        raise ModelError("this chat cannot be answered")
        yield  # pragma: no cover - makes this a generator, so the refusal comes from the first pass


class FailingMidStream:
    """A model that writes one draft and then crashes."""

    name = "scripted"

    def stream_chat(
        self, messages: Sequence[ChatMessage], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Draft]:
        yield Draft(step=0, pieces=())
        raise RuntimeError("the accelerator fell off the bus")


def test_a_refusal_from_the_first_pass_is_an_http_error_before_the_stream() -> None:
    with serve(Refusing(), ServerConfig()) as refusing:
        status, _ = sse_events(refusing)
        assert status == 400
        assert post(refusing).status_code == 400


def test_a_failure_during_a_stream_ends_it_with_an_error_event_and_done() -> None:
    with serve(FailingMidStream(), ServerConfig()) as failing:
        status, events = sse_events(failing)
    assert status == 200
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "fell off the bus" in error["message"]


def test_queue_full_is_a_503_before_the_stream_and_the_last_place_goes_to_one_request_only() -> None:
    slow: ChatModel = PacedModel(scripted_byte_model(ANSWER * 8), 0.05)
    with serve(slow, ServerConfig(max_queue=2)) as busy:
        client = openai.OpenAI(base_url=busy.api_url, api_key="unused", max_retries=0, timeout=60)
        running = client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "hi"}], max_tokens=200, stream=True
        )
        next(iter(running))
        statuses: list[int] = []

        def ask() -> None:
            statuses.append(sse_events(busy, max_tokens=4)[0])

        askers = [threading.Thread(target=ask) for _ in range(6)]  # six requests race for one place
        for asker in askers:
            asker.start()
        deadline = time.monotonic() + 30
        while statuses.count(503) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        running.close()
        for asker in askers:
            asker.join(timeout=60)
    assert sorted(statuses) == [200] + [503] * 5
    assert busy.scheduler.stats.rejected == 5


def test_a_character_across_a_block_end_streams_whole_in_both_formats(server: RunningServer) -> None:
    answer = post(server).json()["choices"][0]["message"]["content"]
    assert answer == ANSWER
    status, events = sse_events(server)
    chunks = [json.loads(event) for event in events[:-1]]
    assert status == 200 and events[-1] == "[DONE]" and all("error" not in chunk for chunk in chunks)
    assert "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks) == ANSWER
    status, events = sse_events(server, diffusing=True)
    drafts = [json.loads(event) for event in events[:-1]]
    drafts = [(d["choices"][0]["delta"]["content"], d["diffusion"]["committed_chars"]) for d in drafts
              if d["choices"][0]["delta"].get("content") is not None]
    assert drafts[-1] == (ANSWER, len(ANSWER))
    for text, committed in drafts:
        assert "\ufffd" not in text
        assert ANSWER.startswith(text[:committed])  # what was called final is final


def test_finish_reason_length_and_usage_count_only_what_was_returned() -> None:
    one_pass = scripted_byte_model("hello", block_length=8, steps_per_block=1)  # EOS committed past the cut
    with serve(one_pass, ServerConfig()) as running:
        cut = post(running, max_tokens=3).json()
        assert cut["choices"][0]["finish_reason"] == "length"
        assert (cut["choices"][0]["message"]["content"], cut["usage"]["completion_tokens"]) == ("hel", 3)
        whole = post(running, max_tokens=5).json()
        assert (whole["choices"][0]["finish_reason"], whole["usage"]["completion_tokens"]) == ("stop", 5)


def test_usage_after_a_stop_string_counts_the_tokens_returned(server: RunningServer) -> None:
    reply = post(server, stop=[" au"]).json()
    assert reply["choices"][0]["message"]["content"] == "Café"
    assert reply["usage"]["completion_tokens"] == 5  # "C", "a", "f" and the two bytes of "é"
    _, events = sse_events(server, stop=[" au"], stream_options={"include_usage": True})
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 5
