"""Graceful shutdown of the real process: SIGTERM or SIGINT closes sockets with 1001 and a reason; exit status 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]

SERVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.integration.ws_harness import load_test_engines, session_config
    from web.config import WebConfig
    from web.launch import run_server

    run_server(load_test_engines(Path(sys.argv[1])), session_config(), WebConfig(port=0))
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_closes_sockets_with_a_reason_and_exits_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("voice-assistant: serving http://127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1].strip(" /\n"))
        with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "ready"
            ws.send(json.dumps({"type": "text", "text": "hello there"}))
            started = time.monotonic()
            process.send_signal(sig)
            with pytest.raises(ConnectionClosed) as closed:
                while time.monotonic() - started < 30:
                    ws.recv(timeout=30)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1001 and closed.value.rcvd.reason == "server shutting down"
        assert process.wait(timeout=30) == 0
        assert "shutting down" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
