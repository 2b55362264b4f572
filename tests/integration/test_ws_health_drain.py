"""Health, readiness, metrics and draining of the voice worker: real models, real speech, loopback sockets."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.integration.ws_harness import (
    Received,
    collect,
    running_server,
    speak_one_turn,
)
from voice.engines import Engines
from web.config import WebConfig
from web.metrics import histogram_buckets
from web.server import VoiceServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def base(server: VoiceServer) -> str:
    return f"http://127.0.0.1:{server.port}"


def test_health_readiness_and_metrics_follow_a_spoken_turn(engines: Engines) -> None:
    async def scenario() -> dict[str, object]:
        seen: dict[str, object] = {}
        async with running_server(engines, WebConfig(port=0, max_sessions=1)) as server, httpx.AsyncClient() as http:
            seen["healthz"] = (await http.get(base(server) + "/healthz")).status_code
            seen["ready_empty"] = (await http.get(base(server) + "/readyz")).status_code
            async with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
                received = Received()
                await collect(ws, received, until="ready")
                full = await http.get(base(server) + "/readyz")
                seen["ready_full"] = (full.status_code, full.text)
                await ws.send("{not json")  # one refused frame: an `error` the server itself sends
                await speak_one_turn(ws, received)
                seen["turn_end"] = received.of_type("turn_end")[0]
                scrape = await http.get(base(server) + "/metrics")
                seen["metrics"] = (scrape.status_code, scrape.headers["content-type"], scrape.text)
            await server.wait_until_idle()
            seen["ready_after"] = (await http.get(base(server) + "/readyz")).status_code
        return seen

    seen = asyncio.run(scenario())
    assert seen["healthz"] == 200 and seen["ready_empty"] == 200 and seen["ready_after"] == 200
    assert seen["ready_full"][0] == 503 and "full: 1 of 1" in seen["ready_full"][1]
    status, content_type, text = seen["metrics"]
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    assert "voice_sessions_open 1.0" in text and "voice_sessions_total 1.0" in text
    assert 'voice_turns_total{interrupted="false"} 1.0' in text
    assert 'voice_errors_total{code="protocol_error"} 1.0' in text
    # the one observation sits in the bucket that holds the turn's own voice-to-voice figure
    v2v_s = seen["turn_end"]["latency_ms"]["voice_to_voice"] / 1000
    buckets = histogram_buckets(text, "voice_to_voice_seconds")
    first_holding = next(bound for bound, count in buckets if count == 1)
    below = max((bound for bound, _ in buckets if bound < first_holding), default=0.0)
    assert below < v2v_s <= first_holding


def test_drain_lets_the_turn_in_flight_finish_then_closes_1001_with_a_reason(engines: Engines) -> None:
    async def scenario() -> tuple[Received, int, int, list[int]]:
        async with running_server(engines, WebConfig(port=0, drain_timeout_s=60)) as server, \
                httpx.AsyncClient() as http, connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            received = Received()
            await collect(ws, received, until="ready")
            await ws.send(json.dumps({"type": "text", "text": "tell me about the moon"}))
            await collect(ws, received, until="draft")
            drain = asyncio.create_task(server.drain())
            await asyncio.sleep(0.2)
            ready = (await http.get(base(server) + "/readyz")).status_code
            refused: list[int] = []
            try:
                async with connect(f"ws://127.0.0.1:{server.port}/ws"):
                    refused.append(101)
            except InvalidStatus as error:
                refused.append(error.response.status_code)
            await collect(ws, received, timeout_s=90)  # until the server closes the socket
            await drain
            return received, ready, received.audio_bytes, refused

    received, ready, audio_bytes, refused = asyncio.run(scenario())
    kinds = [m["type"] for m in received.messages]
    assert ready == 503 and refused == [503]
    assert "turn_end" in kinds and audio_bytes > 0, kinds  # the answer in flight was finished, with its speech
    assert kinds[-1] == "error" and received.messages[-1]["code"] == "going_away", kinds
    assert kinds.index("turn_end") < len(kinds) - 1
    assert received.close_code == 1001 and received.close_reason == "server shutting down"
