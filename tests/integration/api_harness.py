"""Shared set-up of the API tests: dlm-serve in a background thread over a tiny real diffusion chat model."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from model.chat import ChatMessage, ChatModel, Draft, GenerationOptions
from model.server.background import RunningServer
from model.server.background import serve_in_thread as serve
from scripts.report_lib.local_service import wait_ready

__all__ = ["PacedModel", "RunningServer", "serve", "start_lm_service", "tiny_chat_model"]

ROOT = Path(__file__).resolve().parents[2]


def tiny_chat_model(folder: Path, block_length: int = 8) -> ChatModel:
    """A real `DiffusionChatModel` over a random 2-layer BERT (scripts/report_lib/tiny_models.py): fast, offline, and
    multi-pass (one token committed per pass), so streams have many drafts. Its words are random, not an answer."""
    from model.chat.spec import DecodingSettings, ModelSpec
    from model.loading import load_chat_model
    from scripts.report_lib.tiny_models import tiny_bert

    return load_chat_model(ModelSpec(str(tiny_bert(folder)), decoding=DecodingSettings(block_length=block_length)))


class PacedModel:
    """The real tiny model, held to at least `pass_s` per refinement pass, so that a client leaving mid-answer does not
    depend on how fast this machine runs the tiny model (200 passes can finish within the client's patience)."""

    def __init__(self, inner: ChatModel, pass_s: float) -> None:
        self.inner = inner
        self.name = inner.name
        self.pass_s = pass_s

    def stream_chat(
        self, messages: Sequence[ChatMessage], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Draft]:
        for draft in self.inner.stream_chat(messages, options, cancel):
            time.sleep(self.pass_s)
            yield draft


def start_lm_service(port: int, served: str, *flags: str) -> subprocess.Popen[bytes]:
    """`dlm-serve` with the bundled model (and `flags`), as its own process; returns once /readyz answers 200."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "model.server.cli", "--port", str(port), "--served-name", served, "--log-level",
         "warning", *flags], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_ready(f"http://127.0.0.1:{port}/readyz", 120, process)
    return process
