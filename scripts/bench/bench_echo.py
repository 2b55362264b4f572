"""Talking over open speakers: an independent-style `/ws` client whose microphone hears the assistant's answers again.

Starts `voice-assistant serve` of this checkout on a free loopback port, then runs the same conversation three times:
with `hello` `"echo_cancellation": "server"`, without (the comparison), and on a headset (no echo at all: the
reference for the barge-in speech's WER and delays): 12 user turns of real recorded speech (pocketsphinx-testdata's
LibriVox sentences), every second one interrupted 0.8 s into its answer by another recorded talker (the card names;
an answer with less than a second left to play then passes its barge-in on to the next); answers play on a simulated
loudspeaker whose echo (120 ms, a decaying room tail, -8 dB, noise) is mixed into the microphone
(scripts/report_lib/open_speakers.py). Prints, for each run: turns started by the echo, answers cut by their own
echo, barge-ins heard (their `clear`) within 1 s of their first sound, the barge-in speech's WER, and the
canceller's cost per 10 ms frame (its own CPU time on 60 s of real speech, and the server's wall time per frame
from the turns' stats).

    python scripts/bench/bench_echo.py [--turns 12] [--json artifacts/bench_echo.json] [--no-baseline] [--log DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from scripts.heard_latency import free_port, wait_ready
from scripts.report_lib.open_speakers import RATE, Log, OpenSpeakerClient, Room, judge
from scripts.report_lib.speech_samples import card_clips, librivox_clips
from scripts.report_lib.wer import word_error_rate
from voice.audio import load_audio_16k
from voice.listen.echo import FRAME, EchoCanceller

ROOT = Path(__file__).resolve().parents[2]
# a barge-in talks over an answer with at least this much still to play 0.8 s into it (a one-phrase answer such as
# "A young man." is over before the card is said: nothing to interrupt)
BARGE_IN_OVER_S = 1.0


def spawn_server(port: int, log: Path) -> subprocess.Popen[bytes]:
    """This checkout's server (not the installed one): the module is run from the checkout's root."""
    command = [sys.executable, "-c", "import sys; from web.cli import main; sys.exit(main())", "serve",
               "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(command, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)


async def conversation(url: str, turns: int, server_cancels: bool, room: Room) -> tuple[dict[str, Any], Log]:
    from websockets.asyncio.client import connect

    users, barge = librivox_clips(), card_clips()
    if not users or not barge:
        raise SystemExit("bench_echo: pocketsphinx-testdata is not installed (make system-packages)")
    async with connect(url, max_size=None) as ws:
        client = OpenSpeakerClient(ws, room, server_cancels)
        await client.hello()
        runner = asyncio.create_task(client.run(), name="open-speakers")
        try:
            await asyncio.sleep(1.0)
            barge_ins_due = barge_ins = 0  # every second turn owes one; an answer too short to talk over passes it on
            for i in range(turns):
                clip = users[i % len(users)]
                answered_before = client.speaker.turn
                await client.say(load_audio_16k(clip.path), clip.text)
                barge_ins_due += i % 2
                if (barge_ins_due and await client.until_played(0.8, limit_s=30, after_turn=answered_before)
                        and len(client.speaker.buffer) >= BARGE_IN_OVER_S * RATE):
                    interrupting = barge[barge_ins % len(barge)]
                    await client.say(load_audio_16k(interrupting.path), interrupting.text, barge_in=True)
                    barge_ins_due, barge_ins = barge_ins_due - 1, barge_ins + 1
                await client.wait_turn_end(limit_s=30)
                await client.quiet(1.5)
        finally:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
    figures = judge(client.log)
    finals = [(t, m["text"]) for t, m in client.log.messages if m["type"] == "transcript" and m["final"]]
    pairs = []
    for start, _, text, barge_in in client.log.utterances:
        if barge_in:
            heard = next((said for t, said in finals if t >= start), "")
            pairs.append((text, heard))
    figures["barge_in_wer"] = word_error_rate(pairs) if pairs else None
    figures["barge_in_heard_as"] = [heard for _, heard in pairs]
    stats = [m["stats"] for m in client.log.turn_ends if "echo_ms_per_frame" in m["stats"]]
    if stats:
        figures["server_ms_per_frame"] = stats[-1]["echo_ms_per_frame"]
        figures["server_erle_db"] = stats[-1].get("echo_erle_db")
        figures["half_duplex"] = stats[-1]["echo_half_duplex"]
    return figures, client.log


def cpu_per_frame(seconds: float = 60.0) -> dict[str, float]:
    """The canceller's own CPU time (this thread) per 10 ms frame on real speech with its echo, after the session's
    first minute: what a session costs a core."""
    far = np.concatenate([load_audio_16k(c.path) for c in librivox_clips()])
    far = np.tile(far, int(np.ceil(seconds * 16000 / len(far))))[: int(seconds * 16000)]
    echo = np.convolve(far, Room().impulse())[: len(far)].astype(np.float32)
    canceller = EchoCanceller()
    canceller.timeline.sent(1, far, 0)
    costs = []
    for at in range(0, len(far) - FRAME + 1, FRAME):
        started = time.thread_time()
        canceller.process(echo[at : at + FRAME])
        costs.append(time.thread_time() - started)
    ms = np.array(costs) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "share_of_one_core": float(ms.mean() / 10)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--gain-db", type=float, default=-8.0, help="the echo's level (default -8 dB)")
    parser.add_argument("--no-baseline", action="store_true", help="only the run with cancellation")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--log", type=Path, help="write each run's client log (utterances, messages) here")
    args = parser.parse_args(argv)
    room = Room(gain_db=args.gain_db)
    port = free_port()
    log = Path(f"/tmp/bench-echo-server-{port}.log")
    server = spawn_server(port, log)
    results: dict[str, Any] = {"room": {"delay_s": room.delay_s, "gain_db": room.gain_db, "tail_s": room.tail_s,
                                        "noise_db": room.noise_db}}
    try:
        asyncio.run(wait_ready(port, server))
        url = f"ws://127.0.0.1:{port}/ws"
        runs = [("server cancels", True, room)]
        if not args.no_baseline:
            runs += [("no cancellation", False, room), ("headset", False, replace(room, gain_db=-200.0))]
        for name, cancels, heard_room in runs:
            results[name], log = asyncio.run(conversation(url, args.turns, cancels, heard_room))
            if args.log:  # what the client said and heard, on its clock: where each figure came from
                args.log.mkdir(parents=True, exist_ok=True)
                (args.log / f"{name.replace(' ', '_')}.json").write_text(
                    json.dumps({"utterances": log.utterances, "messages": log.messages}, indent=1))
            print(name, json.dumps(results[name]), flush=True)
    finally:
        server.terminate()
        server.wait(30)
    results["cpu_per_10ms_frame"] = cpu_per_frame()
    print("canceller CPU per 10 ms frame:", json.dumps(results["cpu_per_10ms_frame"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
