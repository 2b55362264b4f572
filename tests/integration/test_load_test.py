"""scripts/load_test.py: one spawned server on loopback, one client, one real spoken turn; figures and memory are
reported, the server shuts down cleanly; anything but loopback is refused before a socket opens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "load_test.py"
CLIP = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav")
DEFAULT_ADAPTER = ROOT / "model" / "bundled" / "default" / "adapter.json"


def _load_test(*args: str, timeout: float = 280.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_one_client_one_turn_on_a_spawned_server(tmp_path: Path) -> None:
    if not CLIP.is_file():
        pytest.skip("pocketsphinx-testdata not installed")
    model: list[str] = []
    if not DEFAULT_ADAPTER.exists():  # the bundled model is being trained: a tiny random BERT runs the same code
        from scripts.report_lib.tiny_models import tiny_bert

        model = ["--model", str(tiny_bert(tmp_path / "tiny-bert"))]
    out = tmp_path / "load.json"
    done = _load_test(str(CLIP), "--spawn", "--clients", "1", "--turns", "1", "--max-new-tokens", "8",
                      "--json", str(out), "--server-log", str(tmp_path / "server.log"), *model)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    (level,) = result["levels"]
    assert (level["clients"], level["turns_attempted"], level["turns_completed"], level["errors"]) == (1, 1, 1, 0)
    server_v2v, client_v2v = level["voice_to_voice_ms"]["p50"], level["client_voice_to_voice_ms"]["p50"]
    assert server_v2v > 0 and client_v2v > 0
    assert client_v2v == pytest.approx(server_v2v, abs=250.0)  # same turn, seen from the other end of a loopback socket
    assert result["server"]["rss_mb_at_start"] > 50 and level["server_rss_mb"] > 50
    assert result["server"]["exit_code"] == 0  # SIGTERM: graceful shutdown
    assert "| clients | turns done |" in done.stdout


def test_a_server_off_this_machine_is_refused(tmp_path: Path) -> None:
    done = _load_test("--ws", "ws://192.0.2.10:8765/ws", "--json", str(tmp_path / "x.json"), timeout=60)
    assert done.returncode == 2
    assert "only targets loopback" in done.stderr and done.stderr.strip().count("\n") == 0
    assert not (tmp_path / "x.json").exists()
