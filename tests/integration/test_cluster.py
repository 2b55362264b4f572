"""HAProxy + 2 voice workers + 1 shared `dlm-serve` on loopback (scripts/report_lib/cluster.py), real processes,
real speech: 4 WebSocket clients are all answered and spread over both workers, the workers' /metrics agree with the
load test's own figures, a worker killed under its sessions loses only those: they reconnect through the balancer
to the other worker, whose own session is untouched; and that worker, drained with SIGTERM mid-answer, finishes the
answer before it closes the session with `going_away` and 1001."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from scripts.report_lib.cluster import Cluster, scrape
from scripts.report_lib.inputs import recorded_speech
from scripts.report_lib.load import run_level
from tests.integration.ws_harness import Received, collect
from web.metrics import LATENCY_BUCKETS, bucket_index, histogram_buckets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


async def typed_turn(ws, text: str) -> Received:
    received = Received()
    await ws.send(json.dumps({"type": "text", "text": text}))
    return await collect(ws, received, until="turn_end", timeout_s=120)


def test_four_clients_through_haproxy_then_a_worker_killed_under_its_sessions(tmp_path: Path) -> None:
    clips = [c for c in recorded_speech() if "librivox" in str(c)]
    if not clips:
        pytest.skip("pocketsphinx-testdata not installed")

    async def scenario() -> dict[str, object]:
        seen: dict[str, object] = {}
        async with Cluster(tmp_path, workers=2, max_new_tokens=16) as cluster:
            level = await run_level(cluster.url, clients=4, turns=1, clips=clips, limit_s=300)
            seen["level"] = level
            scrapes = [await scrape(f"{cluster.worker_url(i)}/metrics") for i in range(2)]
            seen["sessions_per_worker"] = [gauge(text, "voice_sessions_total") for text in scrapes]
            merged: dict[float, float] = {}
            for text in scrapes:
                for bound, count in histogram_buckets(text, "voice_to_voice_seconds"):
                    merged[bound] = merged.get(bound, 0.0) + count
            seen["metrics_buckets"] = sorted(merged.items())

            # one session on each worker (leastconn, both idle), then worker 0 dies under its session
            first = await connect(cluster.url)
            await collect(first, Received(), until="ready")
            second = await connect(cluster.url)
            await collect(second, Received(), until="ready")
            open_now = [gauge(await scrape(f"{cluster.worker_url(i)}/metrics"), "voice_sessions_open")
                        for i in range(2)]
            seen["open_before_kill"] = open_now
            victim = 0
            on_victim, on_survivor = (first, second) if await _is_on(cluster, first, victim) else (second, first)
            cluster.kill_worker(victim)
            await collect(on_victim, Received(), timeout_s=30)  # returns once the socket is closed (else times out)
            seen["victim_state"] = on_victim.state.name
            # the client reconnects through the same balancer address: the other worker answers it
            async with connect(cluster.url) as again:
                await collect(again, Received(), until="ready")
                seen["reconnected_turn"] = await typed_turn(again, "hello, are you still there?")
            seen["survivor_turn"] = await typed_turn(on_survivor, "what is the weather like?")
            seen["survivor_open"] = on_survivor.state.name

            # a deploy: SIGTERM drains the survivor while it answers; its turn ends in full before the close
            drained = Received()
            await on_survivor.send(json.dumps({"type": "text", "text": "tell me about the moon"}))
            await collect(on_survivor, drained, until="draft")
            cluster.drain_worker(1 - victim)
            await collect(on_survivor, drained, timeout_s=90)
            seen["drained"] = drained
        return seen

    seen = asyncio.run(scenario())
    level = seen["level"]
    assert level["turns_completed"] == 4 and level["errors"] == 0, level
    assert all(count >= 1 for count in seen["sessions_per_worker"]), seen["sessions_per_worker"]
    assert sum(seen["sessions_per_worker"]) == 4
    # the workers' histograms hold the very turns the load test timed, each in its bucket: a median of four
    # (interpolated in a bucket against one between two samples) would be no test of that
    buckets = seen["metrics_buckets"]
    assert buckets[-1][1] == 4, buckets
    per_bucket = [count - below for (_, count), (_, below) in zip(buckets, [(0.0, 0.0), *buckets[:-1]], strict=True)]
    binned = [0] * (len(LATENCY_BUCKETS) + 1)
    for sample_ms in level["voice_to_voice_samples_ms"]:
        binned[bucket_index(sample_ms / 1000)] += 1
    assert per_bucket == binned, (buckets, level["voice_to_voice_samples_ms"])
    assert seen["open_before_kill"] == [1.0, 1.0]
    assert seen["victim_state"] == "CLOSED"
    for turn in (seen["reconnected_turn"], seen["survivor_turn"]):
        assert turn.of_type("turn_end") and turn.of_type("answer")[0]["text"].strip()
        assert not turn.of_type("error")
        assert turn.audio_bytes > 0
    assert seen["survivor_open"] == "OPEN"
    drained = seen["drained"]
    kinds = [m["type"] for m in drained.messages]
    assert "turn_end" in kinds and kinds[-1] == "error" and drained.messages[-1]["code"] == "going_away", kinds
    assert drained.close_code == 1001, (drained.close_code, drained.close_reason)


async def _is_on(cluster: Cluster, ws, worker: int) -> bool:
    """Whether `ws`'s session is on `worker`: a typed turn on it moves that worker's token counter."""
    before = gauge(await scrape(f"{cluster.worker_url(worker)}/metrics"), "voice_lm_tokens_total")
    await typed_turn(ws, "hi")
    after = gauge(await scrape(f"{cluster.worker_url(worker)}/metrics"), "voice_lm_tokens_total")
    return after > before
