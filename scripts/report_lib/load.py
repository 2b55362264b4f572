"""The load test's moving parts: a spawned server process, its memory, and N concurrent clients doing spoken turns.

Every client is a `WebSocketRunner` (scripts/report_lib/runners.py) streaming real speech in real time, so the server
sees what N people talking at once would give it. Everything is bounded: clients per level, turns per client, and a
wall-clock limit per level after which the clients are cancelled and the level is reported as cut short.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scripts.report_lib.local_service import free_port
from scripts.report_lib.report_math import LATENCY_FIELDS, Summary, summarise
from scripts.report_lib.runners import ServerUnreachable, TurnResult, WebSocketRunner

START_TIMEOUT_S = 180.0  # loading three models on a busy 2-core machine


class LoadTestError(Exception):
    """The load test cannot run as asked (a non-loopback URL, a server that died); the message says why."""


def check_loopback(url: str) -> None:
    """The load test only ever targets this machine: it is a flood by design."""
    host = urlsplit(url).hostname or ""
    if host not in {"127.0.0.1", "::1", "localhost"}:
        raise LoadTestError(f"the load test only targets loopback servers, not {host or url!r}")


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process in MiB (VmRSS from /proc), None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass(slots=True)
class SpawnedServer:
    """`voice-assistant serve` in a child process on a free loopback port; stopped with SIGTERM (graceful)."""

    extra_args: Sequence[str] = ()
    max_sessions: int = 8
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise LoadTestError("the server is not running")
        return self.process.pid

    async def start(self, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        command = [
            sys.executable, "-c", "import sys; from web.cli import main; sys.exit(main())",
            "serve", "--host", "127.0.0.1", "--port", str(self.port), "--max-sessions", str(self.max_sessions),
            "--max-sessions-per-client", str(self.max_sessions),  # every client of a load test is on loopback
            *self.extra_args,
        ]  # fmt: skip
        self.process = _launch(command, log_path)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LoadTestError(f"the server exited with code {self.process.returncode}: {_last_line(log_path)}")
            if await _port_open(self.port):
                return
            await asyncio.sleep(0.5)
        await self.stop()
        raise LoadTestError(f"the server did not listen within {START_TIMEOUT_S:g} s (log: {log_path})")

    async def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        for _ in range(200):
            if self.process.poll() is not None:
                return self.process.returncode
            await asyncio.sleep(0.05)
        self.process.kill()
        return await asyncio.to_thread(self.process.wait)


def _launch(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(no output)"


async def _port_open(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


@dataclass(slots=True)
class ClientOutcome:
    results: list[TurnResult] = field(default_factory=list)
    failure: str | None = None  # the client could not connect or its connection broke


async def _client(
    url: str, clips: Sequence[Path], turns: int, offset: int, delay_s: float, per_connection: int | None
) -> ClientOutcome:
    """`turns` spoken turns; a new connection (a new conversation) every `per_connection` turns when set."""
    outcome = ClientOutcome()
    await asyncio.sleep(delay_s)
    per_connection = per_connection or turns
    done = 0
    try:
        while done < turns:
            async with WebSocketRunner(url, realtime=True) as runner:
                for _ in range(min(per_connection, turns - done)):
                    outcome.results.append(await runner.run_turn(clips[(offset + done) % len(clips)]))
                    done += 1
    except ServerUnreachable as err:
        outcome.failure = str(err)
    return outcome


async def sample_rss(pid: int, samples: list[tuple[float, float]], every_s: float = 5.0) -> None:
    """Append (seconds since start, RSS MiB) every `every_s` until cancelled: a leak grows steadily, while an
    allocator warming up to a peak load plateaus."""
    started = time.monotonic()
    while True:
        value = rss_mb(pid)
        if value is not None:
            samples.append((round(time.monotonic() - started, 1), round(value, 1)))
        await asyncio.sleep(every_s)


async def run_level(
    url: str,
    clients: int,
    turns: int,
    clips: Sequence[Path],
    limit_s: float,
    stagger_s: float = 0.25,
    per_connection: int | None = None,
) -> dict[str, Any]:
    """`clients` concurrent clients of `turns` spoken turns each; figures for the level."""
    started = time.monotonic()
    tasks = [
        asyncio.create_task(
            _client(url, clips, turns, index, index * stagger_s, per_connection), name=f"load-client-{index}"
        )
        for index in range(clients)
    ]
    done, pending = await asyncio.wait(tasks, timeout=limit_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    outcomes = [task.result() for task in done if not task.cancelled() and task.exception() is None]
    crashed = [repr(task.exception()) for task in done if not task.cancelled() and task.exception() is not None]
    results = [result for outcome in outcomes for result in outcome.results]
    spoken = [r for r in results if isinstance(r.latency_ms.get("voice_to_voice"), int | float)]
    errors = [error for r in results for error in r.errors]
    errors += [o.failure for o in outcomes if o.failure] + crashed
    server_v2v = summarise(r.latency_ms["voice_to_voice"] for r in spoken)
    client_v2v = summarise(r.client_voice_to_voice for r in spoken)
    return {
        "clients": clients,
        "turns_per_client": turns,
        "turns_attempted": clients * turns,
        "turns_completed": len(spoken),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "cut_short": bool(pending),
        "wall_s": round(time.monotonic() - started, 1),
        "voice_to_voice_ms": _figures(server_v2v),
        # the server's own figures, each turn: what a worker's voice_to_voice_seconds histogram must hold
        "voice_to_voice_samples_ms": sorted(float(r.latency_ms["voice_to_voice"]) for r in spoken),
        "client_voice_to_voice_ms": _figures(client_v2v),
        # where the time goes as sessions are added: each stage's p50 (the server's breakdown of each turn)
        "stages_p50_ms": {name: _figures(summarise(r.latency_ms.get(name) for r in spoken))["p50"]
                          for name in LATENCY_FIELDS if name != "voice_to_voice"},
    }


def _figures(summary: Summary) -> dict[str, float | None]:
    return {key: None if value is None else round(value, 1) for key, value in
            (("p50", summary.p50), ("p95", summary.p95), ("max", summary.max))}


def memory_bound_ok(before_mb: float | None, after_mb: float | None, bound_mb: float) -> bool | None:
    if before_mb is None or after_mb is None:
        return None
    return after_mb - before_mb <= bound_mb


def add_server_target(parser: argparse.ArgumentParser) -> None:
    """The server a load script talks to: a running one (`--ws`; `--server-pid` for its memory) or its own
    (`--spawn`)."""
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--ws", help="a running server on this machine, e.g. ws://127.0.0.1:8765/ws")
    target.add_argument("--spawn", action="store_true", help="start `voice-assistant serve` on a free loopback port")
    parser.add_argument("--server-pid", type=int, help="pid of the --ws server, to read its memory")


def pid_of(value: int | None) -> int | None:
    """A pid given on the command line, checked to exist (so a typo does not read as 'no memory figures')."""
    if value is None:
        return None
    if not Path(f"/proc/{value}").is_dir():
        raise LoadTestError(f"no process with pid {value}")
    return value

