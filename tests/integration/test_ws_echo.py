"""Server-side echo cancellation over a real socket: a client on simulated open speakers (its answers come back into
its microphone, 120 ms late, at -8 dB, with a room's tail; the microphone at 48 kHz) interrupts an answer; the real
models hear it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from websockets.asyncio.client import connect

from scripts.report_lib.open_speakers import OpenSpeakerClient, Room, judge, timeline
from scripts.report_lib.speech_samples import card_clips, librivox_clips
from tests.integration.ws_harness import running_server
from voice.audio import load_audio_16k
from voice.engines import Engines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_client_on_open_speakers_talks_over_an_answer_and_its_echo_starts_nothing(engines: Engines) -> None:
    users, barge = librivox_clips(), card_clips()
    if not users or not barge:
        pytest.skip("pocketsphinx-testdata is not installed")

    async def scenario() -> OpenSpeakerClient:
        async with running_server(engines) as server, connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            client = OpenSpeakerClient(ws, Room(), server_cancels=True, mic_rate=48_000)
            ready = await client.hello()
            assert ready["echo_cancellation"] == "server" and ready["input_sample_rate"] == 48_000
            runner = asyncio.create_task(client.run(), name="open-speakers")
            try:
                await client.say(load_audio_16k(users[1].path), users[1].text)
                assert await client.until_played(0.8, limit_s=60, after_turn=None)
                await client.say(load_audio_16k(barge[0].path), barge[0].text, barge_in=True)
                assert await client.wait_turn_end(limit_s=60)
            finally:
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            return client

    client = asyncio.run(scenario())
    figures = judge(client.log)
    # no answer is cut by its own echo; a residual that only pauses the answer (a speech start that resumes) is still
    # seen in some runs on a loaded 2-core CI host (2 in one run of five), so it is reported, not asserted
    assert figures["self_interruptions"] == 0, f"{figures}\n{timeline(client.log)}"
    print(f"turns started by the echo: {figures['turns_started_by_echo']} (paused and resumed)")
    # the barge-in is heard: its sound paused the answer, its words cleared it. Not asserted: within 1 s of its first
    # sound, which scripts/bench/bench_echo.py measures: on the 2-core machine 0.47-0.73 s in one run, 0.6-1.7 s in
    # another beside someone's test run (a Whisper decode then takes 0.1-0.7 s): timed that tightly, it would fail on a
    # busy CI runner
    assert figures["barge_in_pause_s"][0] is not None and figures["barge_in_clear_s"][0] is not None, (
        f"{figures}\n{timeline(client.log)}")
    stats = client.log.turn_ends[-1]["stats"]
    # the stat counts the barge-in's double talk and the first second's convergence too: over one short turn it is
    # a few dB (bench_echo's longer runs without barge-ins read ~30 dB)
    assert stats["echo_half_duplex"] == 0 and stats["echo_erle_db"] > 0
