"""dlm-serve on loopback, driven by the official `openai` client and raw HTTP: streams, drafts, usage, cancel, errors.

The model is a real `DiffusionChatModel` over a tiny random BERT (one token committed per pass, blocks of 8), so each
answer takes many refinement passes; its words are random, which is fine: every check compares the server with itself.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from model.chat import ChatModel
from model.server import ServerConfig
from tests.integration.api_harness import PacedModel, RunningServer, serve, tiny_chat_model

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "system", "content": "you are a cat"}, {"role": "user", "content": "hello how are you"}]
LIMIT = 200  # the tiny BERT has 256 positions, prompt included


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ChatModel:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture(scope="module")
def server(model: ChatModel) -> RunningServer:
    with serve(model, ServerConfig(max_tokens_limit=LIMIT, max_body_bytes=20_000)) as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=60)


def answer(client: openai.OpenAI, model: ChatModel, **kwargs) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=16, seed=7, **kwargs)


def test_models_lists_the_served_model(client: openai.OpenAI, model: ChatModel) -> None:
    models = client.models.list()
    assert [entry.id for entry in models.data] == [model.name]
    assert models.data[0].model_extra["diffusing"] is True


def test_non_stream_answer_with_usage(client: openai.OpenAI, model: ChatModel) -> None:
    response = answer(client, model)
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert answer(client, model).choices[0].message.content == choice.message.content  # same seed, same answer


def test_stream_appends_committed_text_and_matches_non_stream(client: openai.OpenAI, model: ChatModel) -> None:
    expected = answer(client, model).choices[0].message.content
    chunks = list(answer(client, model, stream=True, stream_options={"include_usage": True}))
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == expected
    assert len([chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]) > 1  # incremental
    finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finish in (["stop"], ["length"])
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens > 0
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + usage_chunk.usage.completion_tokens


def test_stream_without_include_usage_has_no_usage(client: openai.OpenAI, model: ChatModel) -> None:
    chunks = list(answer(client, model, stream=True))
    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_diffusing_stream_sends_whole_drafts(client: openai.OpenAI, model: ChatModel) -> None:
    expected = answer(client, model).choices[0].message.content
    chunks = list(answer(client, model, stream=True, extra_body={"diffusing": True}))
    drafts = [
        (chunk.choices[0].delta.content, chunk.model_extra["diffusion"])
        for chunk in chunks
        if chunk.choices and chunk.choices[0].delta.content is not None
    ]
    texts = [text for text, _ in drafts]
    assert texts[0] == ""  # the role chunk: an empty draft
    assert texts[-1] == expected  # the last draft is the answer, not a tail of it
    assert len(set(texts)) >= 3  # the draft really changed while it was refined
    committed = [info["committed_chars"] for _, info in drafts]
    assert committed == sorted(committed)  # the committed prefix only grows
    for text, info in drafts:
        prefix = text[: info["committed_chars"]]
        assert expected.startswith(prefix)  # what was committed is exactly the start of the final answer
    assert committed[-1] == len(expected)


def test_raw_sse_ends_with_done(server: RunningServer, model: ChatModel) -> None:
    body = {"model": model.name, "messages": MESSAGES, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", f"{server.api_url}/chat/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")


def test_stop_string_ends_the_answer(client: openai.OpenAI, model: ChatModel) -> None:
    full = answer(client, model).choices[0].message.content
    words = full.split()
    stop = " " + words[2] if len(words) > 3 else words[-1]
    cut = full[: full.find(stop)]
    response = answer(client, model, stop=[stop])
    assert response.choices[0].message.content == cut
    assert response.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in answer(client, model, stop=stop, stream=True)
                       if c.choices)
    assert streamed == cut


def wait_for(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_client_closing_a_stream_cancels_its_generation(model: ChatModel) -> None:
    with serve(PacedModel(model, 0.02), ServerConfig(max_tokens_limit=LIMIT)) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=60)
        stream = client.chat.completions.create(
            model=model.name, messages=MESSAGES, max_tokens=LIMIT, seed=1, stream=True, extra_body={"diffusing": True}
        )
        next(iter(stream))
        next(iter(stream))
        stream.close()
        assert wait_for(lambda: server.scheduler.stats.cancelled == 1)
        server.wait_idle()
        assert server.scheduler.stats.completed == 0  # the 200-token answer (25 blocks) was not run to its end


def test_client_leaving_a_non_stream_request_cancels_it(model: ChatModel) -> None:
    with serve(PacedModel(model, 0.02), ServerConfig(max_tokens_limit=LIMIT)) as server:
        before = server.scheduler.stats.cancelled
        body = {"model": model.name, "messages": MESSAGES, "max_tokens": LIMIT}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.api_url}/chat/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
        assert wait_for(lambda: server.scheduler.stats.cancelled == before + 1)


def error_of(response: httpx.Response) -> dict:
    payload = response.json()
    assert set(payload) == {"error"}
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["message"]
    return payload["error"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "MODEL"}, 400, "messages"),
        ({"model": "MODEL", "messages": "hello"}, 400, "messages"),
        ({"model": "MODEL", "messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
        ({"model": "MODEL", "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
        ({"model": "MODEL", "messages": []}, 400, "messages"),
        ({"model": "MODEL", "messages": MESSAGES, "max_tokens": -1}, 400, "max_tokens"),
        ({"model": "MODEL", "messages": MESSAGES, "max_tokens": "5"}, 400, "max_tokens"),
        ({"model": "MODEL", "messages": MESSAGES, "max_tokens": LIMIT + 1}, 400, "max_tokens"),
        ({"model": "MODEL", "messages": MESSAGES, "temperature": 3}, 400, "temperature"),
        ({"model": "MODEL", "messages": MESSAGES, "n": 2}, 400, "n"),
        ({"model": "MODEL", "messages": MESSAGES, "seed": 2**70}, 400, "seed"),
        ({"model": "MODEL", "messages": MESSAGES, "stream": "yes"}, 400, "stream"),
        ({"model": 42, "messages": MESSAGES}, 400, "model"),
        ({"model": "no-such-model", "messages": MESSAGES}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors(
    server: RunningServer, model: ChatModel, body: dict, status: int, param: str
) -> None:
    if body.get("model") == "MODEL":
        body = {**body, "model": model.name}
    response = httpx.post(f"{server.api_url}/chat/completions", json=body, timeout=30)
    assert response.status_code == status
    error = error_of(response)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    if status == 404:
        assert error["code"] == "model_not_found"


def test_invalid_json_oversized_body_and_unknown_route(server: RunningServer) -> None:
    url = f"{server.api_url}/chat/completions"
    broken = httpx.post(url, content=b'{"model": "x", "messages": [', headers={"content-type": "application/json"})
    assert broken.status_code == 400
    assert "JSON" in error_of(broken)["message"]
    huge = httpx.post(url, json={"model": "x", "messages": [{"role": "user", "content": "a" * 30_000}]})
    assert huge.status_code == 413
    assert error_of(huge)["code"] == "request_too_large"
    missing = httpx.get(f"{server.api_url}/nothing-here")
    assert missing.status_code == 404
    error_of(missing)


def test_openai_client_raises_typed_errors(client: openai.OpenAI, model: ChatModel) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=-3)


def test_openapi_document_describes_the_request(server: RunningServer) -> None:
    document = httpx.get(f"{server.base_url}/openapi.json").json()
    schema = document["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages"} <= set(schema["required"])
    assert {"max_tokens", "max_completion_tokens", "temperature", "seed", "stop", "stream", "stream_options",
            "diffusing", "n"} <= set(schema["properties"])
    responses = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413", "503"} <= set(responses)


def test_bearer_token_is_required_when_set(model: ChatModel) -> None:
    with serve(model, ServerConfig(api_key="s3cret")) as server:
        url = f"{server.api_url}/models"
        assert httpx.get(url).status_code == 401
        wrong = httpx.get(url, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert error_of(wrong)["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.api_url, api_key="nope", max_retries=0).models.list()
        good = openai.OpenAI(base_url=server.api_url, api_key="s3cret", max_retries=0)
        reply = good.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=8)
        assert reply.choices[0].message.content


def test_full_queue_answers_503_and_fifo_order_holds(model: ChatModel) -> None:
    with serve(PacedModel(model, 0.02), ServerConfig(max_queue=2, max_tokens_limit=LIMIT)) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=60)
        long_stream = client.chat.completions.create(
            model=model.name, messages=MESSAGES, max_tokens=LIMIT, stream=True
        )
        next(iter(long_stream))  # running
        finished: list[str] = []

        def short(tag: str) -> None:
            client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=8)
            finished.append(tag)

        waiting = threading.Thread(target=short, args=("queued",))
        waiting.start()
        assert wait_for(lambda: server.scheduler.pending == 2)
        busy = httpx.post(f"{server.api_url}/chat/completions",
                          json={"model": model.name, "messages": MESSAGES, "max_tokens": 8})
        assert busy.status_code == 503
        assert error_of(busy)["code"] == "server_overloaded"
        assert finished == []  # the queued request waits for the running one
        long_stream.close()
        waiting.join(timeout=60)
        assert finished == ["queued"]
        assert server.scheduler.stats.rejected == 1


def test_shutdown_cancels_a_running_generation(model: ChatModel) -> None:
    with serve(PacedModel(model, 0.02), ServerConfig(max_tokens_limit=LIMIT), graceful_timeout_s=0) as server:
        client = openai.OpenAI(base_url=server.api_url, api_key="unused", max_retries=0, timeout=60)
        stream = client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=LIMIT, stream=True)
        next(iter(stream))
        scheduler = server.scheduler
    # leaving `serve` is uvicorn's SIGTERM path: no time to drain here, so cancel at once, then close the scheduler
    assert scheduler.pending == 0
    assert scheduler.stats.cancelled == 1 and scheduler.stats.completed == 0
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        list(stream)
