"""Issue 47: a voice turn answered by a model named `ollama:NAME` (laid out as Ollama does), here through the browser
protocol: `voice-assistant serve --model ollama:smollm2:135m` in a child process, a real spoken question over /ws, and
the turn's record (`turn_end`) carrying the LM's end-of-turn probability. The microphone mode's case is a parameter of
tests/integration/test_local_mode.py."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from tests.integration.ollama_store import OLLAMA_MODEL, smollm2_store
from tests.integration.ws_harness import SPEECH_CLIP, SPEECH_WORDS, Received, collect, speak_one_turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"^voice-assistant: serving http://127\.0\.0\.1:(\d+)/")


def serve(store: dict[str, str], log: list[str]) -> tuple[subprocess.Popen[str], int]:
    """`voice-assistant serve --model ollama:...` on a free loopback port; its console lines up to the URL in `log`."""
    env = {**os.environ, **store, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "web.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--model", OLLAMA_MODEL,
         "--max-new-tokens", "16"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:  # ends when the process does; the test's timeout bounds a hang
        log.append(line.rstrip("\n"))
        if match := SERVING.match(line):
            return process, int(match.group(1))
    process.wait()
    raise AssertionError(f"the server exited with {process.returncode} before serving:\n" + "\n".join(log))


def test_a_spoken_turn_over_ws_is_answered_by_an_ollama_model(tmp_path: Path) -> None:
    if not SPEECH_CLIP.is_file():
        pytest.skip("Debian's pocketsphinx-testdata is not installed (`make install` installs it)")
    log: list[str] = []
    process, port = serve(smollm2_store(tmp_path / "ollama"), log)

    async def scenario() -> Received:
        async with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            received = Received()
            await collect(ws, received, until="ready")
            await speak_one_turn(ws, received)
            return received

    try:
        received = asyncio.run(scenario())
    finally:
        process.terminate()
        code = process.wait(timeout=30)
    assert code == 0, "\n".join(log)
    final = [m for m in received.of_type("transcript") if m["final"]]
    assert len(final) == 1 and len(set(re.findall(r"[a-z]+", final[0]["text"].lower())) & SPEECH_WORDS) >= 5
    answer = received.of_type("answer")
    assert answer and re.search(r"[A-Za-z]{2}", answer[0]["text"]), answer  # words of a real chat model
    assert received.audio_bytes > 0
    end = received.of_type("turn_end")[0]
    assert end["interrupted"] is False and end["user_text"] == final[0]["text"].strip()
    probability = end["stats"].get("lm_end_of_turn")
    print(f"heard {final[0]['text']!r}; answered {answer[0]['text']!r}; LM end of turn {probability}")
    assert probability is not None and 0.0 <= probability <= 1.0, end["stats"]
