"""Fuzzing the WebSocket endpoint: hypothesis-made frame sequences against a live server on loopback (bounded in
examples and time). Every frame gets its documented answer, the session stays usable, the server never closes the
socket on bad input, and no task outlives the server."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from tests.integration.ws_harness import session_config
from voice.engines import Engines
from web.config import WebConfig
from web.server import VoiceServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
bad_json_objects = st.fixed_dictionaries(
    {"type": st.sampled_from(["hello", "text", "interrupt", "audio", "HELLO", ""]) | st.text(max_size=6)},
    optional={"sample_rate": json_values, "text": json_values, "protocol": json_values, "x": json_values},
).filter(lambda obj: obj["type"] != "text" or not isinstance(obj.get("text"), str))
frames = st.one_of(
    st.binary(min_size=0, max_size=3000),  # audio-ish: odd lengths, empty, JSON-looking bytes
    st.text(max_size=200),  # text that is usually not JSON
    json_values.map(json.dumps),
    bad_json_objects.map(json.dumps),
    st.just(json.dumps({"type": "interrupt"})),
)


class ThreadedServer:
    """The real server in its own event loop thread, so sync hypothesis examples can talk to it."""

    def __init__(self, engines: Engines) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = VoiceServer(engines, session_config(), WebConfig(port=0))
        self.leftover: set[str] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ws-fuzz-server", daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def stop() -> set[str]:
            await self.server.shutdown()
            await asyncio.sleep(0.1)
            return {t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}

        self.leftover = asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}/ws"


@pytest.fixture(scope="module")
def server(engines: Engines) -> Iterator[ThreadedServer]:
    with ThreadedServer(engines) as running:
        yield running
    assert running.leftover == set(), f"tasks leaked past shutdown: {running.leftover}"
    assert running.server.active_sessions == 0


def read_json(ws: ClientConnection, timeout_s: float = 10.0) -> dict:
    """The next JSON message, skipping assistant audio."""
    while True:
        frame = ws.recv(timeout=timeout_s)
        if isinstance(frame, str):
            return json.loads(frame)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=st.lists(frames, min_size=1, max_size=12))
def test_fuzzed_frames_never_break_the_session(server: ThreadedServer, sequence: list[str | bytes]) -> None:
    with connect(server.url, max_size=None) as ws:
        assert read_json(ws)["type"] == "ready"
        for frame in sequence:
            ws.send(frame)
        # A hello after the fuzz must still be answered: the session and its tasks are alive.
        ws.send(json.dumps({"type": "hello", "sample_rate": 16000}))
        while (message := read_json(ws))["type"] != "ready":
            assert message["type"] in {"error", "vad", "transcript", "draft", "answer", "audio_start", "audio_end",
                                       "clear", "turn_end"}, message
            if message["type"] == "error":
                assert message["code"] in {"protocol_error", "limit_exceeded", "bad_audio"} and message["message"]
    # the socket was never closed by the server: `recv` above would have raised ConnectionClosed
