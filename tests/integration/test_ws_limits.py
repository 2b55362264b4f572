"""Each per-connection limit over a real loopback socket, against the real server with a scripted session (no models):
frame size, the incoming queue, sessions per client address, and the outbound queue (speech paced near real time,
`clear` ahead of queued speech, no audio of a cleared turn after it, `pause` holding speech until `resume`, bounded
lanes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.integration.scripted_session import RATE, ScriptedSession, scripted_server
from tests.integration.ws_harness import Received, collect
from voice import events as ev
from web.config import WebConfig
from web.server import VoiceServer

pytestmark = [pytest.mark.timeout(60)]


def url(server: VoiceServer) -> str:
    return f"ws://127.0.0.1:{server.port}/ws"


def test_a_frame_over_the_message_limit_closes_with_1009_before_it_is_buffered() -> None:
    async def scenario() -> Received:
        server, _ = scripted_server(WebConfig(port=0, max_message_bytes=4096))
        async with server, connect(url(server), max_size=None) as ws:
            received = Received()
            await collect(ws, received, until="ready")
            await ws.send(b"\x00" * 4096)  # at the limit: accepted
            await ws.send(b"\x00" * 4098)
            return await collect(ws, received, timeout_s=10)

    received = asyncio.run(scenario())
    assert received.close_code == 1009 and "4096" in received.close_reason
    assert not received.of_type("error")


def test_frames_waiting_for_a_busy_session_are_bounded_by_the_queue() -> None:
    config = WebConfig(port=0, max_queued_messages=8, audio_burst_s=1000.0, audio_close_after_s=1000.0)

    async def scenario() -> tuple[int, int]:
        server, sessions = scripted_server(config)
        async with server, connect(url(server)) as ws:
            await collect(ws, Received(), until="ready")
            sessions[0].gate.clear()  # the session is stuck in a long decode
            frame = b"\x00" * 60_000
            sender = asyncio.create_task(_send_many(ws, frame, 200))
            await asyncio.sleep(1.5)
            (conn,) = server._server.connections  # type: ignore[union-attr]
            queued = len(conn.recv_messages.frames)
            sessions[0].gate.set()
            sender.cancel()
            return queued, sessions[0].fed

    queued, _ = asyncio.run(scenario())
    # websockets stops reading the socket once `max_queue` frames wait; one read may bring a few more (256 KiB)
    assert 0 < queued <= 8 + (256 * 1024) // 60_000 + 1, queued


async def _send_many(ws, frame: bytes, count: int) -> None:
    for _ in range(count):
        await ws.send(frame)


def test_one_address_cannot_hold_every_session() -> None:
    config = WebConfig(port=0, max_sessions=8, max_sessions_per_client=2)

    async def scenario() -> tuple[Received, Received]:
        server, _ = scripted_server(config)
        async with server, connect(url(server)) as one, connect(url(server)) as two:
            await collect(one, Received(), until="ready")
            await collect(two, Received(), until="ready")
            async with connect(url(server)) as three:
                refused = await collect(three, Received(), timeout_s=10)
            # another device (another loopback address) still gets in
            async with connect(url(server), local_addr=("127.0.0.2", 0)) as other:
                accepted = await collect(other, Received(), until="ready", timeout_s=10)
            return refused, accepted

    refused, accepted = asyncio.run(scenario())
    assert refused.close_code == 1013 and refused.close_reason == "too many sessions from your address"
    assert refused.of_type("error")[0]["code"] == "server_busy"
    assert accepted.ready()["protocol"] == 1 and accepted.close_code is None


def test_speech_is_paced_and_clear_overtakes_it_with_nothing_of_the_turn_after_it() -> None:
    lead_s = 0.3

    async def scenario() -> tuple[list[tuple[float, str | int]], float]:
        server, _ = scripted_server(WebConfig(port=0, audio_lead_s=lead_s), speech_s=5.0)
        timeline: list[tuple[float, str | int]] = []  # (seconds since audio_start, message type or audio bytes)
        async with server, connect(url(server)) as ws:
            await collect(ws, Received(), until="ready")
            await ws.send(json.dumps({"type": "text", "text": "talk"}))
            started: float | None = None
            interrupted_at = None
            while True:
                frame = await asyncio.wait_for(ws.recv(), 10)
                now = time.monotonic()
                if isinstance(frame, bytes):
                    timeline.append((now - (started or now), len(frame)))
                else:
                    kind = json.loads(frame)["type"]
                    started = now if kind == "audio_start" else started
                    timeline.append((now - (started or now), kind))
                    if kind == "turn_end":
                        break
                if started is not None and interrupted_at is None and now - started > 0.5:
                    interrupted_at = now - started
                    await ws.send(json.dumps({"type": "interrupt"}))
            # anything still queued (a late chunk of the cleared turn) would arrive within the lead
            with contextlib.suppress(TimeoutError):
                while True:
                    frame = await asyncio.wait_for(ws.recv(), lead_s + 0.5)
                    timeline.append((0.0, len(frame) if isinstance(frame, bytes) else json.loads(frame)["type"]))
        return timeline, interrupted_at or 0.0

    timeline, interrupted_at = asyncio.run(scenario())
    kinds = [item for _, item in timeline]
    clear_index = kinds.index("clear")
    clear_at = timeline[clear_index][0]
    sent_before_clear = sum(item for _, item in timeline[:clear_index] if isinstance(item, int)) / 2 / RATE
    # paced: by the time `clear` arrived, the client held at most real time + the lead + one 100 ms chunk (+ 0.2 s:
    # the client's clock starts when audio_start arrives, a little after the server's)
    assert 0 < sent_before_clear <= clear_at + lead_s + 0.1 + 0.2, (sent_before_clear, clear_at)
    assert sent_before_clear < 4.0  # unpaced, all 5 s would have been sent before the interrupt
    # control overtakes queued speech: the answer came before the turn's audio was through
    assert kinds.index("answer") < clear_index
    # nothing of the cleared turn after `clear`: no audio, not even its audio_end
    assert not any(isinstance(item, int) or item == "audio_end" for item in kinds[clear_index:])
    assert kinds[-1] == "turn_end" and interrupted_at > 0.5


class CoughingSession(ScriptedSession):
    """Each audio frame from the client is a sound while the answer plays: the first pauses it (a cough?), the next
    resumes it (it was not words), as voice.turn.session does."""

    async def feed_audio(self, pcm16: bytes, sample_rate: int = RATE) -> None:
        await super().feed_audio(pcm16, sample_rate)
        event = ev.Pause if self.fed == 1 else ev.Resume
        self._out.put_nowait(event(session=self.id, turn=1))


def test_pause_holds_the_speech_until_resume_and_none_of_it_is_lost() -> None:
    cough = b"\x00\x00" * 320

    async def scenario() -> tuple[Received, Received, Received]:
        server, _ = scripted_server(WebConfig(port=0, audio_lead_s=0.3), CoughingSession, speech_s=3.0)
        async with server, connect(url(server)) as ws:
            await collect(ws, Received(), until="ready")
            await ws.send(json.dumps({"type": "text", "text": "talk"}))
            before = await collect(ws, Received(), until="audio_start")
            await asyncio.sleep(0.5)
            await ws.send(cough)
            await collect(ws, before, until="pause")
            paused = Received()
            with contextlib.suppress(TimeoutError):  # paced and unpaused, a second of speech would come meanwhile
                await collect(ws, paused, until="audio_end", timeout_s=1.5)
            await ws.send(cough)
            after = await collect(ws, Received(), until="audio_end")
        return before, paused, after

    before, paused, after = asyncio.run(scenario())
    assert before.audio_bytes > 0 and paused.audio_bytes == 0 and paused.messages == []
    assert after.messages[0]["type"] == "resume" and after.messages[-1]["type"] == "audio_end"
    assert before.audio_bytes + after.audio_bytes == 3 * RATE * 2  # paused, not dropped: all of the answer is sent


def test_speech_beyond_the_outbound_bound_is_dropped_with_one_error() -> None:
    async def scenario() -> Received:
        server, _ = scripted_server(WebConfig(port=0, max_queued_audio_s=1.0, audio_lead_s=10.0), speech_s=3.0)
        async with server, connect(url(server)) as ws:
            received = Received()
            await collect(ws, received, until="ready")
            await ws.send(json.dumps({"type": "text", "text": "talk"}))
            return await collect(ws, received, until="audio_end", timeout_s=10)

    received = asyncio.run(scenario())
    errors = received.of_type("error")
    assert len(errors) == 1 and errors[0]["code"] == "limit_exceeded" and errors[0]["turn"] == 1
    assert received.audio_bytes == 1.0 * RATE * 2  # one second queued; the other two were dropped


def test_a_client_that_stops_reading_is_closed_when_its_queue_fills() -> None:
    async def scenario() -> tuple[int | None, str]:
        server, _ = scripted_server(WebConfig(port=0, max_queued_control=50), speech_s=0.1, drafts=500)
        async with server, connect(url(server)) as ws:
            await ws.send(json.dumps({"type": "text", "text": "talk"}))
            await asyncio.sleep(1.0)  # reads nothing meanwhile
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            except ConnectionClosed as closed:
                return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")

    code, reason = asyncio.run(scenario())
    assert code == 1008 and "not reading" in reason


def test_typed_turns_past_the_limit_are_refused_one_by_one_and_the_session_goes_on() -> None:
    config = WebConfig(port=0, typed_turn_burst=2, typed_turn_interval_s=600.0)

    async def scenario() -> tuple[Received, list[str], int]:
        server, sessions = scripted_server(config, speech_s=0.0)
        async with server, connect(url(server)) as ws:
            received = Received()
            await collect(ws, received, until="ready")
            for index in range(5):
                await ws.send(json.dumps({"type": "text", "text": f"turn {index}"}))
            await ws.send(b"\x00\x00" * 320)  # audio still flows
            await ws.send(json.dumps({"type": "hello", "sample_rate": 16000}))  # and the connection still answers
            await collect(ws, received, until="ready", timeout_s=10)
            return received, sessions[0].texts, sessions[0].fed

    received, texts, fed = asyncio.run(scenario())
    assert texts == ["turn 0", "turn 1"]
    refusals = received.of_type("error")
    assert len(refusals) == 3 and all(error["code"] == "limit_exceeded" for error in refusals)
    assert all("typed turns arrive too fast" in error["message"] for error in refusals)
    assert all("turn" not in error for error in refusals)  # about a client frame, not a turn
    assert fed == 1 and received.close_code is None
