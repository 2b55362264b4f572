"""dlm-serve's /healthz, /readyz and /metrics over a real tiny diffusion model on loopback."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from model.server import ServerConfig
from tests.integration.api_harness import serve, tiny_chat_model
from web.metrics import histogram_buckets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

KEY = "a-test-key-0123456789"


def test_health_needs_no_key_and_metrics_count_passes_tokens_and_errors(tmp_path: Path) -> None:
    model = tiny_chat_model(tmp_path, block_length=4)
    with serve(model, ServerConfig(api_key=KEY, max_queue=4)) as running, httpx.Client(timeout=60) as http:
        base = running.base_url
        assert http.get(f"{base}/healthz").text == "ok\n"
        ready = http.get(f"{base}/readyz")
        assert ready.status_code == 200 and ready.text.startswith("ready: 0 of 4")
        assert http.get(f"{base}/v1/models").status_code == 401  # the API itself still wants the key
        auth = {"Authorization": f"Bearer {KEY}"}
        body = {"model": model.name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
        answer = http.post(f"{base}/v1/chat/completions", json=body, headers=auth)
        assert answer.status_code == 200
        usage = answer.json()["usage"]
        running.wait_idle()
        text = http.get(f"{base}/metrics").text

    assert 'dlm_generations_total{outcome="completed"} 1.0' in text
    assert "dlm_queue_depth 0.0" in text
    assert f"dlm_completion_tokens_total {float(usage['completion_tokens'])}" in text
    assert 'dlm_errors_total{code="invalid_api_key"} 1.0' in text
    passes = histogram_buckets(text, "dlm_pass_seconds")
    assert passes[-1][1] >= usage["completion_tokens"] / 4  # at least one pass per block of 4 tokens
