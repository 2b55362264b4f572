"""Fuzz dlm-serve from its own served /openapi.json with schemathesis: valid and invalid requests, never a 5xx.

Bounded: a fixed number of examples per mode and a per-example deadline; answers are short (max_tokens_limit 8).
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from model.chat import ChatModel
from model.server import ServerConfig
from tests.integration.api_harness import RunningServer, serve, tiny_chat_model

pytestmark = pytest.mark.timeout(180)
TOKEN = "fuzz-token"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ChatModel:
    return tiny_chat_model(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture(scope="module")
def server(model: ChatModel) -> RunningServer:
    with serve(model, ServerConfig(max_tokens_limit=8, default_max_tokens=8, api_key=TOKEN)) as running:
        yield running


# 100 valid requests: about one in eight reaches the model (the rest are refused first: a blank chat, an integer out of
# range), so that none does is a chance of about 1e-6, where 40 missed about one run in eight
@pytest.mark.parametrize(("mode", "examples"), [(GenerationMode.POSITIVE, 100), (GenerationMode.NEGATIVE, 40)])
def test_no_server_errors(server: RunningServer, model: ChatModel, mode: GenerationMode, examples: int) -> None:
    document = httpx.get(f"{server.base_url}/openapi.json").json()
    # Random model ids would all stop at the 404; pin the served one so the generation path is fuzzed too.
    document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]["enum"] = [model.name]
    # A tool message must answer an earlier call's id, which random ids never do: without this pin most valid
    # requests stop there (test_api_tools.py sends real tool results).
    message = document["components"]["schemas"]["Message"]["properties"]
    message["role"]["enum"].remove("tool")
    # Random chats are mostly blank or carry calls with random (non-JSON) arguments, both refused before the model:
    # text content must hold a character, and no calls, so that valid requests do reach the model
    message["content"]["anyOf"][0].update(minLength=1, pattern=r"\S")
    del message["tool_calls"]
    schema = schemathesis.openapi.from_dict(document)
    statuses: list[int] = []

    @given(case=schema.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=10_000, suppress_health_check=list(HealthCheck), database=None)
    def fuzz(case: schemathesis.Case) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}  # reach the handlers behind auth (auth has its own tests)
        response = case.call(base_url=server.base_url, headers=headers, timeout=30)
        statuses.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error], headers=headers)
        assert response.status_code < 500, response.text

    fuzz()
    assert len(statuses) >= examples // 2
    assert any(400 <= status < 500 for status in statuses)  # the fuzzer did reach the validation paths
    if mode is GenerationMode.POSITIVE:
        assert server.scheduler.stats.submitted > 0  # and the model really answered some of them
    server.wait_idle()
    assert server.scheduler.stats.failed == 0  # no crash inside the model either
