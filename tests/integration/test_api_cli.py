"""The `dlm-serve` command as a user runs it: loopback by default, a token for other hosts, graceful SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from model.server.cli import build_parser, config_from_args, is_loopback
from scripts.report_lib.local_service import free_port
from scripts.report_lib.tiny_models import tiny_bert

pytestmark = pytest.mark.timeout(120)
DLM_SERVE = Path(sys.executable).parent / "dlm-serve"


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.8.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.org")


def test_non_loopback_host_needs_a_token() -> None:
    args = build_parser().parse_args(["--host", "0.0.0.0"])
    with pytest.raises(SystemExit, match="DLM_API_KEY"):
        config_from_args(args, {})
    assert config_from_args(args, {"DLM_API_KEY": "t"}).api_key == "t"
    loopback = config_from_args(build_parser().parse_args([]), {})
    assert loopback.api_key is None


def test_device_is_auto_by_default_and_an_unknown_one_is_refused() -> None:
    assert build_parser().parse_args([]).device == "auto"
    assert build_parser().parse_args(["--device", "cpu"]).device == "cpu"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--device", "tpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there: --device cuda would use it")
def test_device_cuda_without_a_gpu_stops_before_serving(capsys) -> None:
    from model.server.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["--device", "cuda"])
    assert stopped.value.code == 2  # a model that cannot load is a usage error, as a bad --model is
    assert "torch sees no CUDA GPU" in capsys.readouterr().err


def test_refuses_to_listen_on_all_interfaces_without_a_token() -> None:
    env = {key: value for key, value in os.environ.items() if key != "DLM_API_KEY"}
    result = subprocess.run([str(DLM_SERVE), "--host", "0.0.0.0"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "DLM_API_KEY" in result.stderr


def test_refuses_a_batch_of_no_answers_before_loading_the_model() -> None:
    result = subprocess.run([str(DLM_SERVE), "--max-batch", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--max-batch must be at least 1" in result.stderr


def test_serves_a_model_and_shuts_down_gracefully_on_sigterm(tmp_path: Path) -> None:
    folder = tiny_bert(tmp_path / "bert")
    port = free_port()
    env = {**os.environ, "DLM_API_KEY": "cli-key"}
    process = subprocess.Popen(
        [str(DLM_SERVE), "--port", str(port), "--model", str(folder), "--graceful-timeout", "3"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="cli-key", max_retries=0, timeout=30)
        deadline = time.monotonic() + 90
        while True:
            try:
                names = [entry.id for entry in client.models.list().data]
                break
            except openai.APIConnectionError:
                assert process.poll() is None, process.stdout.read()
                assert time.monotonic() < deadline, "dlm-serve did not start"
                time.sleep(0.2)
        assert names == ["bert"]
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
        hello = [{"role": "user", "content": "hi"}]
        reply = client.chat.completions.create(model="bert", messages=hello, max_tokens=8)
        assert reply.choices[0].message.content
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down, then re-raises the signal so the exit status still says "terminated by SIGTERM"
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
        output = process.stdout.read()
        assert "Application shutdown complete" in output  # the lifespan ran: the scheduler was closed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
