"""Shared set-up for WebSocket tests: real engines (Whisper tiny.en, piper, a diffusion LM), real speech, a server on
loopback, and a small client that collects what the server sends."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from voice.audio import float32_to_pcm16, load_audio_16k
from voice.engines import Engines
from voice.think.spoken import spoken_answer
from voice.turn.session import SessionConfig
from web.config import WebConfig
from web.server import VoiceServer

# not report_lib.speech_samples: server subprocesses import this module without scripts/ on their path
LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
SPEECH_CLIP = LIBRIVOX / "sense_and_sensibility_01_austen_64kb-0880.wav"  # "he was not an ill disposed young man"
SPEECH_WORDS = {"he", "was", "not", "an", "ill", "disposed", "young", "man"}
DEFAULT_ADAPTER = Path(__file__).resolve().parents[2] / "model" / "bundled" / "default" / "adapter.json"


def load_test_engines(tmp_folder: Path) -> Engines:
    """The real ASR and TTS; the bundled LM when it has been trained, else a tiny random BERT (real code, random
    words) so the pipeline and the socket can be tested before the bundled model exists."""
    from model.chat.spec import DecodingSettings, ModelSpec
    from model.loading import load_chat_model
    from voice.listen.asr_models import load_model
    from voice.speak.tts import load_synthesizer

    if DEFAULT_ADAPTER.exists():
        lm = load_chat_model(None)
    else:
        from scripts.report_lib.tiny_models import tiny_bert

        lm = load_chat_model(ModelSpec(str(tiny_bert(tmp_folder)), decoding=DecodingSettings(block_length=4)))
    return Engines(asr=load_model(None), tts=load_synthesizer(), lm=lm, load_seconds={})


def speech_pcm16(silence_s: float = 1.5, path: Path = SPEECH_CLIP) -> bytes:
    """A real speech clip at 16 kHz as PCM16 LE, with trailing silence so the endpointer can close the turn."""
    samples = load_audio_16k(path)
    padded = np.concatenate([np.zeros(3200, np.float32), samples, np.zeros(int(16000 * silence_s), np.float32)])
    return float32_to_pcm16(padded)


def session_config() -> SessionConfig:

    return SessionConfig(generation=spoken_answer(max_new_tokens=16))


@dataclass
class Received:
    """Everything one client got, in order."""

    messages: list[dict] = field(default_factory=list)
    audio_bytes: int = 0
    close_code: int | None = None
    close_reason: str = ""

    def of_type(self, kind: str) -> list[dict]:
        return [m for m in self.messages if m["type"] == kind]

    def ready(self) -> dict:
        return self.of_type("ready")[0]


async def collect(ws, received: Received, until: str | None = None, timeout_s: float = 120.0) -> Received:
    """Read frames into `received` until a message of type `until` arrives (or the socket closes)."""
    from websockets.exceptions import ConnectionClosed

    deadline = time.monotonic() + timeout_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {until!r} within {timeout_s} s; got {[m['type'] for m in received.messages]}")
            frame = await asyncio.wait_for(ws.recv(), remaining)
            if isinstance(frame, bytes):
                received.audio_bytes += len(frame)
                continue
            message = json.loads(frame)
            received.messages.append(message)
            if until is not None and message["type"] == until:
                return received
    except ConnectionClosed as closed:
        received.close_code = closed.rcvd.code if closed.rcvd else None
        received.close_reason = closed.rcvd.reason if closed.rcvd else ""
        return received


async def speak_one_turn(ws, received: Received, pcm: bytes | None = None) -> Received:
    """Stream `pcm` (the test clip and its silence by default) in real time and read until that turn's `turn_end`."""
    from voice.audio import stream_pcm16

    sender = asyncio.create_task(stream_pcm16(ws.send, speech_pcm16() if pcm is None else pcm, realtime=True))
    await collect(ws, received, until="turn_end")
    await sender
    return received


@asynccontextmanager
async def running_server(engines: Engines, web_config: WebConfig | None = None) -> AsyncIterator[VoiceServer]:
    config = web_config or WebConfig(port=0)
    async with VoiceServer(engines, session_config(), config) as server:
        yield server


async def leftover_tasks(grace_s: float = 5.0) -> set[str]:
    """Names of tasks other than the caller's still alive after `grace_s` (a leak once the server has shut down)."""
    deadline = time.monotonic() + grace_s
    while True:
        others = {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}
        if not others or time.monotonic() > deadline:
            return {t.get_name() for t in others}
        await asyncio.sleep(0.05)
