"""dlm-serve answers an API client as an LLM server does: no voice policy unless the request asks for it.

The bundled model behind the API, a client with no system message asking for three sentences and leaving room for
them, gets more than one (the spoken-answer rules of voice/think/spoken.py, which end an answer after its first
sentence past 24 tokens, and its "one short sentence" system prompt are the voice pipeline's request, not the
server's default).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import openai
import pytest

from model.loading import load_chat_model
from model.server.config import ServerConfig
from tests.integration.api_harness import RunningServer, serve
from voice.think.spoken import SPOKEN_RULES, SPOKEN_SYSTEM_PROMPT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

QUESTION = "Write three sentences about the sea."


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve(load_chat_model(None), ServerConfig()) as running:
        yield running


def sentences(text: str) -> list[str]:
    return [part for part in re.split(r"(?<=[.!?])\s+", text.strip()) if part]


def ask(server: RunningServer, system: str | None = None, **extra: object) -> tuple[str, str]:
    client = openai.OpenAI(base_url=server.api_url, api_key="unused")
    messages = [{"role": "system", "content": system}] if system else []
    reply = client.chat.completions.create(
        model="smollm2-135m-block-diffusion", messages=[*messages, {"role": "user", "content": QUESTION}],
        max_tokens=120, temperature=0.0, extra_body=extra or None,
    )
    return reply.choices[0].message.content or "", reply.choices[0].finish_reason


def test_an_api_client_without_a_system_message_gets_the_sentences_it_asked_for(server: RunningServer) -> None:
    # the spoken rules would end it at its first sentence end past 24 tokens; it goes on, to more sentences or to
    # the client's own max_tokens (the 135M model sometimes runs one sentence on and on)
    answer, finish = ask(server)
    assert len(sentences(answer)) > 1 or finish == "length", (answer, finish)


def test_the_spoken_policy_applies_only_when_a_request_asks_for_it(server: RunningServer) -> None:
    plain, _ = ask(server)
    spoken, finish = ask(server, system=SPOKEN_SYSTEM_PROMPT, answer_rules={
        "no_repeat_ngram": SPOKEN_RULES.no_repeat_ngram, "end_after": SPOKEN_RULES.end_after,
        "no_copy_ngram": SPOKEN_RULES.no_copy_ngram, "no_copy_opening": SPOKEN_RULES.no_copy_opening,
    })
    assert len(spoken) < len(plain) and finish == "stop", (spoken, plain)
    assert spoken.rstrip().endswith((".", "!", "?")), spoken  # ended at a sentence end, by the rule
