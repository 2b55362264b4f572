"""Protocol v1 over a real socket: a plain `websockets` client against the real server and real models on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.integration.ws_harness import (
    SPEECH_WORDS,
    Received,
    collect,
    leftover_tasks,
    running_server,
    speak_one_turn,
    speech_pcm16,
)
from voice.audio import stream_pcm16
from voice.engines import Engines
from web.config import WebConfig
from web.server import VoiceServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def url(server: VoiceServer) -> str:
    return f"ws://127.0.0.1:{server.port}/ws"


def test_spoken_turn_typed_turn_and_interrupt(engines: Engines, monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[bool] = []
    monkeypatch.setattr("web.server.release_free_memory", lambda: trims.append(True) or True)

    async def scenario() -> tuple[Received, Received, Received, set[str]]:
        async with running_server(engines) as server, connect(url(server)) as ws:
            await ws.send(json.dumps({"type": "hello", "sample_rate": 16000}))
            spoken = Received()
            await collect(ws, spoken, until="ready")  # the greeting on connect
            await collect(ws, spoken, until="ready")  # the answer to hello
            await speak_one_turn(ws, spoken)

            typed = Received()
            await ws.send(json.dumps({"type": "text", "text": "hello how are you"}))
            await collect(ws, typed, until="turn_end")

            interrupted = Received()
            await ws.send(json.dumps({"type": "text", "text": "tell me a long story about the sun"}))
            await collect(ws, interrupted, until="audio_start")
            await ws.send(json.dumps({"type": "interrupt"}))
            await collect(ws, interrupted, until="turn_end")
        return spoken, typed, interrupted, await leftover_tasks()

    spoken, typed, interrupted, leftovers = asyncio.run(scenario())

    ready = spoken.ready()
    assert ready["protocol"] == 1 and ready["session"] and ready["sample_rate"] == engines.tts.sample_rate
    assert ready["input_sample_rate"] == 16000
    states = [m["state"] for m in spoken.of_type("vad")]
    assert states[:2] == ["speech_start", "speech_end"]
    final = [m for m in spoken.of_type("transcript") if m["final"]]
    assert len(final) == 1
    heard = set(final[0]["text"].lower().replace(".", "").split())
    assert len(heard & SPEECH_WORDS) >= 5, final[0]["text"]
    assert spoken.of_type("draft"), "the refining answer must be streamed"
    assert spoken.of_type("answer")
    assert spoken.audio_bytes > 0 and spoken.audio_bytes % 2 == 0
    assert spoken.of_type("audio_start") and spoken.of_type("audio_end")
    end = spoken.of_type("turn_end")[0]
    assert end["interrupted"] is False and end["user_text"] == final[0]["text"].strip()
    latency = end["latency_ms"]
    assert latency["voice_to_voice"] > 0
    assert {"asr_final", "lm_first_pass", "first_audio_out"} <= latency.keys()
    assert 0.0 <= end["stats"]["lm_end_of_turn"] <= 1.0  # the LM's end-of-turn probability, in the turn's record
    types = [m["type"] for m in spoken.messages]
    assert types.index("audio_start") < types.index("audio_end") < types.index("turn_end")

    typed_final = [m for m in typed.of_type("transcript") if m["final"]]
    assert typed_final[0]["text"] == "hello how are you"
    assert typed.of_type("answer") and typed.audio_bytes > 0
    assert typed.of_type("turn_end")[0]["latency_ms"]["voice_to_voice"] > 0

    end = interrupted.of_type("turn_end")[-1]
    assert end["interrupted"] is True
    assert interrupted.of_type("clear"), "an interrupt while speaking must tell the client to stop playback"
    assert leftovers == set()
    # freed pages handed back after each turn: the first two trims come before the third turn's events are sent
    # (the last turn's and the session's own may land after the client left); without them, at most 1
    assert len(trims) >= 2


def test_a_client_that_sends_a_clip_and_then_nothing_still_gets_its_answer(engines: Engines) -> None:
    """0.1 s of trailing silence, then no audio at all: the endpointer never hears the pause it waits for, so only the
    server's clock can end the turn. The socket stays open, as a muted browser tab's would."""

    async def scenario() -> Received:
        async with running_server(engines) as server, connect(url(server)) as ws:
            received = Received()
            await collect(ws, received, until="ready")
            await stream_pcm16(ws.send, speech_pcm16(silence_s=0.1), realtime=True)
            await collect(ws, received, until="turn_end", timeout_s=90)
        return received

    received = asyncio.run(scenario())
    # ended by the clock, not by the utterance-length watchdog (60 s later, with a limit_exceeded error)
    assert received.of_type("error") == [], received.of_type("error")
    final = [m for m in received.of_type("transcript") if m["final"]]
    assert len(final) == 1
    assert len(set(final[0]["text"].lower().replace(".", "").split()) & SPEECH_WORDS) >= 5, final[0]["text"]
    end = received.of_type("turn_end")[0]
    assert end["interrupted"] is False and end["user_text"] == final[0]["text"].strip()
    assert received.of_type("answer") and received.audio_bytes > 0


def test_bad_input_gets_an_error_and_the_session_goes_on(engines: Engines) -> None:
    bad_frames: list[str | bytes] = [
        "{not json",
        json.dumps({"type": "dance"}),
        json.dumps({"type": "text"}),
        "just some words where audio is expected",
        b"\x01\x02\x03",  # odd-length PCM
        json.dumps({"type": "text", "text": "x" * 2001}),
        json.dumps({"type": "hello", "sample_rate": 1}),
    ]

    async def scenario() -> tuple[Received, Received]:
        async with running_server(engines) as server, connect(url(server)) as ws:
            errors = Received()
            await collect(ws, errors, until="ready")
            for frame in bad_frames:
                await ws.send(frame)
                await collect(ws, errors, until="error", timeout_s=10)
            after = Received()
            await ws.send(json.dumps({"type": "text", "text": "hi there"}))
            await collect(ws, after, until="turn_end")
        return errors, after

    errors, after = asyncio.run(scenario())
    codes = [m["code"] for m in errors.of_type("error")]
    assert len(codes) == len(bad_frames)
    assert codes.count("limit_exceeded") == 1 and codes.count("protocol_error") == len(bad_frames) - 1
    assert all(m["message"] for m in errors.of_type("error"))
    assert after.of_type("turn_end") and after.close_code is None


def test_frames_over_the_hard_limit_close_with_1009_and_a_reason(engines: Engines) -> None:
    async def scenario() -> Received:
        async with running_server(engines) as server, connect(url(server), max_size=None) as ws:
            received = Received()
            await collect(ws, received, until="ready")
            await ws.send(b"\x00" * (1024 * 1024 + 2))
            return await collect(ws, received, timeout_s=10)

    received = asyncio.run(scenario())
    assert received.close_code == 1009 and "exceeds limit" in received.close_reason


def test_flood_is_throttled_then_closed_while_another_session_keeps_working(engines: Engines) -> None:
    async def scenario() -> tuple[Received, Received, set[str]]:
        async with running_server(engines) as server, connect(url(server)) as good, connect(url(server)) as flooder:
            ok, flood = Received(), Received()
            await collect(good, ok, until="ready")
            await collect(flooder, flood, until="ready")

            async def garbage_then_flood() -> None:
                for frame in ["{", b"\x01", json.dumps({"type": "nope"})]:
                    await flooder.send(frame)
                silence = b"\x00" * 3200  # 100 ms frames, as fast as the socket takes them: 30 s of audio
                for _ in range(300):
                    await flooder.send(silence)
                await collect(flooder, flood, timeout_s=30)

            flooding = asyncio.create_task(garbage_then_flood())
            sender = asyncio.create_task(stream_pcm16(good.send, speech_pcm16(), realtime=True))
            await collect(good, ok, until="turn_end")
            await sender
            await flooding
            await good.send(json.dumps({"type": "text", "text": "are you still there"}))
            await collect(good, ok, until="turn_end")
        return ok, flood, await leftover_tasks()

    ok, flood, leftovers = asyncio.run(scenario())
    assert flood.close_code == 1008 and "faster than real time" in flood.close_reason
    flood_codes = [m["code"] for m in flood.of_type("error")]
    assert flood_codes.count("protocol_error") == 3 and "limit_exceeded" in flood_codes
    assert len(ok.of_type("turn_end")) == 2 and not ok.of_type("error") and ok.audio_bytes > 0
    assert leftovers == set()


def test_disconnect_mid_turn_frees_the_session_and_others_go_on(engines: Engines) -> None:
    async def scenario() -> tuple[Received, int, set[str]]:
        async with running_server(engines) as server:
            async with connect(url(server)) as quitter:
                gone = Received()
                await collect(quitter, gone, until="ready")
                await quitter.send(json.dumps({"type": "text", "text": "what is your name"}))
                await collect(quitter, gone, until="draft")
            # the quitter closed mid-turn; its session and tasks must go away. The bound is far above the ~0.1 s this
            # takes, so only a session that never ends fails, not a slow machine.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_until_idle(), timeout=60)
            sessions_after_quit = server.active_sessions
            async with connect(url(server)) as other:
                ok = Received()
                await collect(other, ok, until="ready")
                await other.send(json.dumps({"type": "text", "text": "hello"}))
                await collect(other, ok, until="turn_end")
        return ok, sessions_after_quit, await leftover_tasks()

    ok, sessions_after_quit, leftovers = asyncio.run(scenario())
    assert sessions_after_quit == 0
    assert ok.of_type("turn_end") and ok.audio_bytes > 0
    assert leftovers == set()


def test_an_utterance_over_the_limit_is_cut_and_answered(engines: Engines) -> None:
    async def scenario() -> Received:
        impatient = WebConfig(port=0, max_utterance_s=1.0)
        async with running_server(engines, impatient) as server, connect(url(server)) as ws:
            received = Received()
            await collect(ws, received, until="ready")
            await speak_one_turn(ws, received)
            return received

    received = asyncio.run(scenario())
    types = [m["type"] for m in received.messages]
    cut = received.of_type("error")[0]
    assert cut["code"] == "limit_exceeded" and "utterance longer than 1 s" in cut["message"]
    assert types.index("error") < types.index("turn_end")
    assert received.of_type("turn_end")[0]["user_text"], "what was heard before the cut is answered"


def test_busy_server_says_so_and_closes_cleanly(engines: Engines) -> None:
    async def scenario() -> Received:
        async with running_server(engines, WebConfig(port=0, max_sessions=1)) as server, connect(url(server)) as first:
            await collect(first, Received(), until="ready")
            async with connect(url(server)) as second:
                return await collect(second, Received(), timeout_s=10)

    received = asyncio.run(scenario())
    assert received.close_code == 1013 and received.close_reason == "server busy"
    assert received.of_type("error")[0]["code"] == "server_busy"


def test_idle_timeout_and_graceful_shutdown_close_with_reasons(engines: Engines) -> None:
    async def scenario() -> tuple[Received, Received]:
        impatient = WebConfig(port=0, idle_timeout_s=0.5)
        async with running_server(engines, impatient) as server, connect(url(server)) as idle:
            idled = await collect(idle, Received(), timeout_s=10)
        server = running_server(engines)
        async with server as running, connect(url(running)) as ws:
            stopping = Received()
            await collect(ws, stopping, until="ready")
            await ws.send(json.dumps({"type": "text", "text": "hello there"}))
            await collect(ws, stopping, until="draft")
            await running.shutdown()
            await collect(ws, stopping, timeout_s=10)
        return idled, stopping

    idled, stopping = asyncio.run(scenario())
    assert idled.close_code == 1000 and "idle timeout" in idled.close_reason
    assert stopping.close_code == 1001 and stopping.close_reason == "server shutting down"


def test_http_page_static_files_and_handshake_checks(engines: Engines, tmp_path: Path) -> None:
    import httpx

    token = "a-long-enough-token-123"

    async def scenario() -> dict[str, object]:
        results: dict[str, object] = {}
        async with running_server(engines) as server:
            base = f"http://127.0.0.1:{server.port}"
            async with httpx.AsyncClient() as http:
                page = await http.get(base + "/")
                js = await http.get(base + "/app.js")
                missing = await http.get(base + "/../pyproject.toml")
                results["page"] = (page.status_code, page.headers["content-type"], 'id="start"' in page.text)
                results["js"] = (js.status_code, js.headers["content-type"])
                results["missing"] = missing.status_code
            async with connect(url(server), origin="https://evil.example") as refused:
                results["origin"] = await collect(refused, Received(), timeout_s=10)
        remote = WebConfig(port=0, host="127.0.0.1", token=token)
        async with running_server(engines, remote) as server:
            with pytest.raises(InvalidStatus) as no_token:
                async with connect(url(server)):
                    pass
            results["no_token"] = no_token.value.response.status_code
            async with connect(url(server) + f"?token={token}") as ws:
                results["query_token"] = (await collect(ws, Received(), until="ready")).ready()["protocol"]
            async with connect(url(server), additional_headers={"Authorization": f"Bearer {token}"}) as ws:
                results["bearer_token"] = (await collect(ws, Received(), until="ready")).ready()["protocol"]
        return results

    results = asyncio.run(scenario())
    assert results["page"] == (200, "text/html; charset=utf-8", True)
    assert results["js"] == (200, "text/javascript; charset=utf-8")
    assert results["missing"] == 404
    origin = results["origin"]
    assert isinstance(origin, Received) and not origin.messages
    assert origin.close_code == 1008 and "evil.example" in origin.close_reason
    assert results["no_token"] == 401
    assert results["query_token"] == 1 and results["bearer_token"] == 1
