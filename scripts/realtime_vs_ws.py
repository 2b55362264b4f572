"""Voice-to-voice through /ws and /v1/realtime, side by side in one run, measured by an independent client.

    python scripts/realtime_vs_ws.py [--trials 4] [--json artifacts/realtime_vs_ws.json] [-- serve flags...]

Starts `voice-assistant serve` in its own process on a free loopback port, then alternates the two protocols on
fresh connections with the same real recorded speech (pocketsphinx-testdata LibriVox clips), streamed in real time in
20 ms chunks as a microphone would: /ws as PCM16 16 kHz binary frames, /v1/realtime as base64 PCM16 24 kHz in
`input_audio_buffer.append` (server VAD, the API's default). Voice-to-voice is measured here, on the client: from
the moment the clip's last voiced sample (Silero VAD, as the session) was spoken to the first audio of the answer
(the first binary frame on /ws, the first `response.output_audio.delta` on /v1/realtime). Both use plain `websockets`
clients, so neither pays a heavier client library.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from scripts.report_lib.load import SpawnedServer
from scripts.report_lib.speech_samples import librivox_clips
from scripts.report_lib.turn_cases import speech_bounds_and_pauses
from voice.audio import float32_to_pcm16, load_audio_16k, resample

CHUNK_S = 0.02
LEAD_S = 0.3  # silence before the speech
TAIL_S = 3.0  # silence after it: the end of turn needs it, and the answer starts within it
TURN_TIMEOUT_S = 60.0


def clip_audio(path: Path) -> tuple[np.ndarray, float]:
    """The clip padded with silence (16 kHz float32), and when its last voiced sample is, in seconds."""
    samples = load_audio_16k(path)
    _, last_voiced, _ = speech_bounds_and_pauses(samples)
    padded = np.concatenate([np.zeros(int(16_000 * LEAD_S), np.float32), samples,
                             np.zeros(int(16_000 * TAIL_S), np.float32)])
    return padded, LEAD_S + last_voiced / 16_000


async def paced(chunks: list[Any], send: Any, started: float) -> None:
    """Send chunk n once its audio has been "captured": at start + (n + 1) x 20 ms."""
    for n, chunk in enumerate(chunks):
        await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK_S - time.monotonic()))
        await send(chunk)


async def ws_turn(port: int, audio: np.ndarray, speech_end_s: float) -> float:
    pcm = float32_to_pcm16(audio)
    step = int(16_000 * CHUNK_S) * 2
    async with connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
        await ws.send(json.dumps({"type": "hello", "sample_rate": 16_000}))
        while json.loads(await ws.recv()).get("type") != "ready":
            pass
        started = time.monotonic()
        sender = asyncio.create_task(paced([pcm[i:i + step] for i in range(0, len(pcm), step)], ws.send, started))
        try:
            async with asyncio.timeout(TURN_TIMEOUT_S):
                while not isinstance(await ws.recv(), bytes):
                    pass
            return time.monotonic() - (started + speech_end_s)
        finally:
            sender.cancel()


async def realtime_turn(port: int, audio: np.ndarray, speech_end_s: float) -> float:
    pcm = float32_to_pcm16(resample(audio, 16_000, 24_000))
    step = int(24_000 * CHUNK_S) * 2
    events = [json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + step]).decode()})
              for i in range(0, len(pcm), step)]
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=voice-assistant", max_size=None) as ws:
        while json.loads(await ws.recv()).get("type") != "session.created":
            pass
        started = time.monotonic()
        sender = asyncio.create_task(paced(events, ws.send, started))
        try:
            async with asyncio.timeout(TURN_TIMEOUT_S):
                while json.loads(await ws.recv()).get("type") != "response.output_audio.delta":
                    pass
            return time.monotonic() - (started + speech_end_s)
        finally:
            sender.cancel()


async def run(trials: int, serve_args: list[str], log: Path) -> dict[str, Any]:
    clips = [clip_audio(c.path) for c in librivox_clips()[:trials]]
    if not clips:
        raise SystemExit("no speech clips: install pocketsphinx-testdata")
    server = SpawnedServer(extra_args=tuple(serve_args))
    await server.start(log)
    figures: dict[str, list[float]] = {"ws": [], "realtime": []}
    try:
        await ws_turn(server.port, *clips[0])  # warm-up: the first answer pays the model's first-use costs
        for n in range(trials):
            audio, speech_end = clips[n % len(clips)]
            order = [("ws", ws_turn), ("realtime", realtime_turn)]
            for name, turn in order if n % 2 == 0 else order[::-1]:  # alternate who goes first
                figures[name].append(round(await turn(server.port, audio, speech_end) * 1000, 1))
                print(f"trial {n + 1} {name:9s} {figures[name][-1]:7.1f} ms", flush=True)
    finally:
        await server.stop()
    summary = {name: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v), "ms": v}
               for name, v in figures.items()}
    paired = [r - w for r, w in zip(figures["realtime"], figures["ws"], strict=True)]
    summary["realtime_minus_ws"] = {"median_ms": round(statistics.median(paired), 1), "ms": paired}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4, help="turns per protocol (default 4)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--server-log", type=Path, default=Path("artifacts/realtime_vs_ws_server.log"))
    parser.add_argument("serve_args", nargs="*", help="flags for `voice-assistant serve` (after --)")
    args = parser.parse_args(argv)
    summary = asyncio.run(run(args.trials, args.serve_args, args.server_log))
    for name in ("ws", "realtime"):
        s = summary[name]
        print(f"{name:9s} median {s['median_ms']:7.1f} ms  (min {s['min_ms']:.1f}, max {s['max_ms']:.1f})")
    print(f"realtime - ws, paired median: {summary['realtime_minus_ws']['median_ms']:+.1f} ms")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
