"""Flood test of the voice server's memory: N hostile clients at once, the server's resident memory sampled throughout.

    python scripts/flood_test.py --spawn [--clients 8] [--seconds 60] [--json FILE]
    python scripts/flood_test.py --ws ws://127.0.0.1:8765/ws --server-pid PID ...

Each client never reads what the server sends and, by its index, floods with one of:
- `audio`: max-size binary frames of noise as fast as the socket takes them (throttled, then closed with 1008);
- `turns`: a typed turn (a long answer: the LM and the voice run, the speech queues for a client that never reads),
  then max-size frames;
- `messages`: small JSON text turns as fast as possible (past a burst of 5 the typed-turn limit refuses each one with
  an error, then the message limit drops them and closes with 1008);
- `oversize`: frames four times the message limit (closed with 1009 before they are buffered).
A client whose socket closes reconnects at once, so the pressure lasts the whole run. The figures: the server's RSS
before (models loaded, one warm-up turn), its peak during the flood, and after the clients are gone; how each
connection ended. Loopback servers only: it is a flood by design.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from scripts.report_lib.load import (
    LoadTestError,
    SpawnedServer,
    add_server_target,
    check_loopback,
    pid_of,
    rss_mb,
    sample_rss,
)
from scripts.report_lib.results import print_and_save

MODES = ("audio", "turns", "messages", "oversize")
FRAME_BYTES = 64 * 1024  # the server's default message limit


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_target(parser)
    parser.add_argument("--clients", type=int, default=8, help="flooding clients at once (1..8, default 8)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the flood lasts (default 60)")
    parser.add_argument("--bound-mb", type=float, default=400.0, help="allowed peak RSS above the baseline")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--server-log", type=Path, default=Path("artifacts/flood_test_server.log"))
    parser.add_argument("--model", help="LM checkpoint for the spawned server (default: the bundled model)")
    return parser


async def flood_client(url: str, mode: str, stop: float, outcomes: Counter[str], rng: np.random.Generator) -> None:
    """Connect, flood, and reconnect whenever the server closes, until `stop` (monotonic seconds)."""
    noise = (rng.standard_normal(FRAME_BYTES // 2) * 3000).astype("<i2").tobytes()
    while time.monotonic() < stop:
        try:
            # max_queue=1: the client's own receive buffer stays tiny, so it really stops reading
            async with connect(url, max_size=None, max_queue=1, open_timeout=10) as ws:
                outcomes["connected"] += 1
                await _flood(ws, mode, noise, stop)
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            outcomes[f"closed {code}"] += 1
        except InvalidStatus as refused:
            outcomes[f"refused {refused.response.status_code}"] += 1
            await asyncio.sleep(0.2)
        except Exception as err:  # a hostile client only counts how its connection ended, whatever the library raised
            outcomes[type(err).__name__] += 1
            await asyncio.sleep(0.2)


async def _flood(ws: Any, mode: str, noise: bytes, stop: float) -> None:
    if mode == "turns":
        await ws.send(json.dumps({"type": "text", "text": "Tell me a long story about the sea and the sky."}))
    while time.monotonic() < stop:
        if mode == "messages":
            frame: str | bytes = json.dumps({"type": "text", "text": "hello there, how are you today?"})
        elif mode == "oversize":
            frame = noise * 4
        else:
            frame = noise
        # a server that stopped reading blocks this send (backpressure) until it reads again or the run ends
        async with asyncio.timeout(max(0.1, stop - time.monotonic())):
            await ws.send(frame)


async def warm_up(url: str) -> None:
    """One typed turn read to its end, so the baseline includes the models' working memory of a normal turn."""
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "text", "text": "hello"}))
        async with asyncio.timeout(180):
            async for frame in ws:
                if isinstance(frame, str) and json.loads(frame)["type"] == "turn_end":
                    return


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server: SpawnedServer | None = None
    url, pid = args.ws, pid_of(args.server_pid)
    if args.spawn:
        extra = ["--model", args.model] if args.model else []
        server = SpawnedServer(extra_args=extra, max_sessions=8)
        print("starting the server (loading models)...", file=sys.stderr, flush=True)
        await server.start(args.server_log)
        url, pid = server.url, server.pid
    if pid is None:
        raise LoadTestError("need --spawn or --server-pid to read the server's memory")
    try:
        await warm_up(url)
        await asyncio.sleep(2.0)
        baseline = rss_mb(pid)
        samples: list[tuple[float, float]] = []  # (seconds since the flood began, RSS MiB)
        outcomes: Counter[str] = Counter()
        # every 0.5 s (the load test's trend needs only 5 s): the figure here is the peak of a short flood
        sampler = asyncio.create_task(sample_rss(pid, samples, every_s=0.5), name="rss-sampler")
        stop = time.monotonic() + args.seconds
        rng = np.random.default_rng(0)
        modes = [MODES[index % len(MODES)] for index in range(args.clients)]
        print(f"flooding with {args.clients} clients for {args.seconds:g} s: {', '.join(modes)}", file=sys.stderr)
        floods = [
            asyncio.create_task(flood_client(url, mode, stop, outcomes, rng), name=f"flood-{index}-{mode}")
            for index, mode in enumerate(modes)
        ]
        await asyncio.gather(*floods)
        during = list(samples)
        await asyncio.sleep(5.0)  # the clients are gone: the server frees their sessions
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        after = rss_mb(pid)
        still_up = server is None or (server.process is not None and server.process.poll() is None)
        await warm_up(url)  # the server still answers a normal turn after the flood
    finally:
        exit_code = await server.stop() if server is not None else None
    peak = max(mb for _, mb in during) if during else None
    growth = None if peak is None or baseline is None else round(peak - baseline, 1)
    return {
        "clients": args.clients,
        "seconds": args.seconds,
        "modes": modes,
        "rss_mb": {
            "baseline": _round(baseline),
            "peak": _round(peak),
            "after": _round(after),
            "peak_growth": growth,
            "bound": args.bound_mb,
        },
        "within_bound": growth is not None and growth <= args.bound_mb,
        "connections": dict(sorted(outcomes.items())),
        "server_alive_during_flood": still_up,
        "server_exit_code": exit_code,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if not 1 <= args.clients <= 8 or not 1 <= args.seconds <= 600:
            raise LoadTestError("--clients must be 1..8 and --seconds 1..600")
        if args.ws:
            check_loopback(args.ws)
        result = asyncio.run(run(args))
    except LoadTestError as err:
        print(f"flood_test: error: {err}", file=sys.stderr)
        return 2
    print_and_save(result, result, args.json)
    return 0 if result["within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
