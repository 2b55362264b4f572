"""The pipeline's `OpenAIChatModel` against a running dlm-serve: drafts in both stream kinds, cancel, errors."""

from __future__ import annotations

import itertools
import socket
import threading
import time

import openai
import pytest

from model.chat import ChatMessage, ChatModel, GenerationOptions
from model.chat.client import OpenAIChatModel
from model.errors import ModelError
from model.server import ServerConfig
from tests.integration.api_harness import RunningServer, serve, tiny_chat_model

pytestmark = pytest.mark.timeout(120)

MESSAGES = (ChatMessage("system", "you are a cat"), ChatMessage("user", "hello how are you"))
OPTIONS = GenerationOptions(max_new_tokens=16, seed=5)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ChatModel:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture(scope="module")
def server(model: ChatModel) -> RunningServer:
    with serve(model, ServerConfig(max_tokens_limit=200, api_key="k3y")) as running:
        yield running


def reference_answer(server: RunningServer, model: ChatModel) -> str:
    client = openai.OpenAI(base_url=server.api_url, api_key="k3y", max_retries=0)
    reply = client.chat.completions.create(
        model=model.name,
        messages=[{"role": m.role, "content": m.content} for m in MESSAGES],
        max_tokens=OPTIONS.max_new_tokens,
        seed=OPTIONS.seed,
    )
    return reply.choices[0].message.content


def test_is_a_chat_model(server: RunningServer, model: ChatModel) -> None:
    assert isinstance(OpenAIChatModel(server.api_url, model.name, api_key="k3y"), ChatModel)


def test_plain_deltas_are_all_committed(server: RunningServer, model: ChatModel) -> None:
    remote = OpenAIChatModel(server.api_url, model.name, api_key="k3y", diffusing=False)
    drafts = list(remote.stream_chat(MESSAGES, OPTIONS))
    final = drafts[-1]
    assert final.done and final.finish_reason in ("stop", "length")
    assert final.text == reference_answer(server, model)
    assert all(piece.committed for draft in drafts for piece in draft.pieces)
    texts = [draft.text for draft in drafts]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))  # append-only
    assert len(drafts) > 2
    assert final.prompt_tokens > 0 and final.completion_tokens > 0  # from the usage chunk


def test_diffusing_is_probed_and_drafts_commit_only_final_text(server: RunningServer, model: ChatModel) -> None:
    remote = OpenAIChatModel(server.api_url, model.name, api_key="k3y")
    assert remote.diffusing is True  # dlm-serve advertises it in /v1/models
    drafts = list(remote.stream_chat(MESSAGES, OPTIONS))
    expected = reference_answer(server, model)
    assert drafts[-1].done and drafts[-1].text == expected
    assert drafts[-1].committed_text == expected
    committed = [draft.committed_text for draft in drafts]
    assert all(expected.startswith(text) for text in committed)  # never commits text the answer lacks
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(committed))
    assert any(not piece.committed for draft in drafts[:-1] for piece in draft.pieces)  # early drafts are guesses
    assert any(draft.text and not draft.done for draft in drafts)


def test_cancel_closes_the_stream_and_the_server_cancels(server: RunningServer, model: ChatModel) -> None:
    server.wait_idle()
    before = server.scheduler.stats.cancelled
    remote = OpenAIChatModel(server.api_url, model.name, api_key="k3y", diffusing=True)
    cancel = threading.Event()
    drafts = []
    for draft in remote.stream_chat(MESSAGES, GenerationOptions(max_new_tokens=200, seed=1), cancel):
        drafts.append(draft)
        cancel.set()
    assert drafts[-1].done and drafts[-1].finish_reason == "cancelled"
    assert len(drafts) <= 3
    deadline = time.monotonic() + 30
    while server.scheduler.stats.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.scheduler.stats.cancelled == before + 1


def test_errors_become_model_errors(server: RunningServer, model: ChatModel) -> None:
    with pytest.raises(ModelError, match="401"):
        wrong_key = OpenAIChatModel(server.api_url, model.name, api_key="wrong", diffusing=False)
        list(wrong_key.stream_chat(MESSAGES, OPTIONS))
    with pytest.raises(ModelError, match="404"):
        list(OpenAIChatModel(server.api_url, "nope", api_key="k3y", diffusing=False).stream_chat(MESSAGES, OPTIONS))
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ModelError, match=r"127\.0\.0\.1"):
        list(OpenAIChatModel(f"http://127.0.0.1:{port}/v1", "x", diffusing=False).stream_chat(MESSAGES, OPTIONS))


def test_from_flags_reads_the_key_from_the_named_variable(
    server: RunningServer, model: ChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "k3y")
    remote = OpenAIChatModel.from_flags(server.api_url, model.name, "TEST_LLM_KEY")
    assert list(remote.stream_chat(MESSAGES, OPTIONS))[-1].text == reference_answer(server, model)
    monkeypatch.delenv("TEST_LLM_KEY")
    with pytest.raises(ModelError, match="TEST_LLM_KEY"):
        OpenAIChatModel.from_flags(server.api_url, model.name, "TEST_LLM_KEY")
