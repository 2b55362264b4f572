"""Load test of the voice server: N concurrent WebSocket clients streaming real speech in real time, on loopback.

    python scripts/load_test.py --spawn [--clients 1,2,4,8] [--turns 3] [--soak 100] [--json FILE]
    python scripts/load_test.py --ws ws://127.0.0.1:8765/ws [--server-pid PID] ...

For each client count: completed turns, errors, p50/p95 voice-to-voice (the server's figure, and the client's, which
adds the socket path); then the largest count whose p95 stays under --bound-ms (2 s). `--soak N` then runs N more
turns (clients reconnect every --turns turns, so sessions come and go) and compares the server's resident memory
before and after, sampled every 5 s (needs --spawn or --server-pid). Bounded: at most 8 clients, at most --turns
turns each, --level-timeout seconds per level; loopback servers only.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from scripts.report_lib.inputs import InputError, check_audio, recorded_speech, resolve_inputs
from scripts.report_lib.load import (
    LoadTestError,
    SpawnedServer,
    add_server_target,
    check_loopback,
    memory_bound_ok,
    pid_of,
    rss_mb,
    run_level,
    sample_rss,
)
from scripts.report_lib.page import machine_info
from scripts.report_lib.report_math import largest_passing
from scripts.report_lib.results import save_json
from scripts.report_lib.runners import ServerUnreachable
from voice.errors import AudioFormatError

MAX_CLIENTS = 8
SETTLE_S = 3.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("audio", nargs="*", type=Path, help="WAV files of speech (default: pocketsphinx-testdata)")
    add_server_target(parser)
    parser.add_argument("--clients", default="1,2,4,8", help="client counts to try, in order (default 1,2,4,8)")
    parser.add_argument("--turns", type=int, default=3, help="spoken turns per client per level (default 3)")
    parser.add_argument("--soak", type=int, default=0, help="then this many turns to check memory growth")
    parser.add_argument("--soak-clients", type=int, default=4, help="concurrent clients during the soak")
    parser.add_argument("--bound-ms", type=float, default=2000.0, help="the p95 voice-to-voice target")
    parser.add_argument("--max-growth-mb", type=float, default=150.0, help="allowed RSS growth over the soak")
    parser.add_argument("--level-timeout", type=float, default=600.0, help="wall-clock limit per level (s)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--server-log", type=Path, default=Path("artifacts/load_test_server.log"))
    spawn = parser.add_argument_group("spawned server")
    spawn.add_argument("--model", help="LM checkpoint for the spawned server (default: the bundled model)")
    spawn.add_argument("--max-new-tokens", type=int, help="answer length limit of the spawned server")
    return parser


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise LoadTestError(f"--clients must be comma-separated integers, got {text!r}") from err
    if not counts or any(not 1 <= n <= MAX_CLIENTS for n in counts):
        raise LoadTestError(f"--clients must be between 1 and {MAX_CLIENTS}, got {text!r}")
    return counts


def _fail(message: str) -> int:
    print(f"load_test: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python scripts/load_test.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        counts = _counts(args.clients)
        if not 1 <= args.turns <= 20 or not 0 <= args.soak <= 500 or not 1 <= args.soak_clients <= MAX_CLIENTS:
            raise LoadTestError("--turns must be 1..20, --soak 0..500, --soak-clients 1..8")
        if args.ws:
            check_loopback(args.ws)
        clips = resolve_inputs(args.audio, None) if args.audio else recorded_speech()
        if not clips:
            raise LoadTestError("no speech clips: install pocketsphinx-testdata or pass WAV files")
        check_audio(clips)
        server_pid = pid_of(args.server_pid)
        result = asyncio.run(_run(args, counts, clips, server_pid))
    except (LoadTestError, InputError, AudioFormatError, ServerUnreachable) as err:
        return _fail(str(err))
    result["command"] = command
    _print(result)
    save_json(result, args.json)
    return 0


async def _run(args: argparse.Namespace, counts: list[int], clips: list[Path], pid: int | None) -> dict[str, Any]:
    server: SpawnedServer | None = None
    url = args.ws
    if args.spawn:
        extra = [*(["--model", args.model] if args.model else [])]
        extra += ["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else []
        server = SpawnedServer(extra_args=extra, max_sessions=MAX_CLIENTS)
        print("starting the server (loading models)...", file=sys.stderr, flush=True)
        await server.start(args.server_log)
        url, pid = server.url, server.pid
    result: dict[str, Any] = {"created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine_info(),
                              "server": {"url": url, "pid": pid, "spawned": server is not None}}
    try:
        result["server"]["rss_mb_at_start"] = _rounded(rss_mb(pid) if pid else None)
        levels = []
        for n in counts:
            print(f"{n} client(s) x {args.turns} turns...", file=sys.stderr, flush=True)
            level = await run_level(url, n, args.turns, clips, args.level_timeout)
            level["server_rss_mb"] = _rounded(rss_mb(pid) if pid else None)
            levels.append(level)
            print(f"  {_level_line(level)}", file=sys.stderr, flush=True)
        result["levels"] = levels
        # a level with errors or cut short fails, whatever its p95 (failed turns have no latency to count)
        p95s = {
            lv["clients"]: None if lv["errors"] or lv["cut_short"] else lv["voice_to_voice_ms"]["p95"] for lv in levels
        }
        result["bound_ms"] = args.bound_ms
        result["largest_clients_p95_under_bound"] = largest_passing(p95s, args.bound_ms)
        if args.soak:
            result["soak"] = await _soak(args, url, clips, pid)
    finally:
        if server is not None:
            result["server"]["exit_code"] = await server.stop()
    return result


async def _soak(args: argparse.Namespace, url: str, clips: list[Path], pid: int | None) -> dict[str, Any]:
    clients = args.soak_clients
    turns = math.ceil(args.soak / clients)
    print(f"soak: {clients} clients x {turns} turns...", file=sys.stderr, flush=True)
    before = rss_mb(pid) if pid else None
    samples: list[tuple[float, float]] = []
    sampler = asyncio.create_task(sample_rss(pid, samples), name="load-rss-sampler") if pid else None
    try:
        limit_s = max(args.level_timeout, 30.0 * turns)
        level = await run_level(url, clients, turns, clips, limit_s, per_connection=args.turns)
        await asyncio.sleep(SETTLE_S)  # let closed sessions finish tearing down before the last reading
    finally:
        if sampler is not None:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    after = rss_mb(pid) if pid else None
    half = samples[len(samples) // 2][1] if samples else None
    return {
        "turns": clients * turns,
        "turns_completed": level["turns_completed"],
        "errors": level["errors"],
        "error_samples": level["error_samples"],
        "cut_short": level["cut_short"],
        "wall_s": level["wall_s"],
        "voice_to_voice_ms": level["voice_to_voice_ms"],
        "rss_mb_before": _rounded(before),
        "rss_mb_after": _rounded(after),
        "rss_growth_mb": _rounded(after - before) if before is not None and after is not None else None,
        "rss_growth_second_half_mb": _rounded(after - half) if half is not None and after is not None else None,
        "rss_mb_samples": samples,
        "growth_bound_mb": args.max_growth_mb,
        "within_bound": memory_bound_ok(before, after, args.max_growth_mb),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def _level_line(level: dict[str, Any]) -> str:
    v2v, client = level["voice_to_voice_ms"], level["client_voice_to_voice_ms"]
    return (
        f"N={level['clients']}: {level['turns_completed']}/{level['turns_attempted']} turns, {level['errors']} errors, "
        f"p50 {_ms(v2v['p50'])} ms, p95 {_ms(v2v['p95'])} ms (client p95 {_ms(client['p95'])} ms), "
        f"{level['wall_s']} s" + (" CUT SHORT" if level["cut_short"] else "")
    )


def _print(result: dict[str, Any]) -> None:
    print("| clients | turns done | errors | p50 v2v (ms) | p95 v2v (ms) | p95 at client (ms) | server RSS (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for lv in result["levels"]:
        v2v, client = lv["voice_to_voice_ms"], lv["client_voice_to_voice_ms"]
        print(
            f"| {lv['clients']} | {lv['turns_completed']}/{lv['turns_attempted']} | {lv['errors']} | "
            f"{_ms(v2v['p50'])} | {_ms(v2v['p95'])} | {_ms(client['p95'])} | {lv['server_rss_mb'] or '–'} |"
        )
    stages = list(result["levels"][0]["stages_p50_ms"]) if result["levels"] else []
    print("\np50 of each stage of a turn (ms, the server's breakdown):\n")
    print("| clients | " + " | ".join(stages) + " |")
    print("|---" * (len(stages) + 1) + "|")
    for lv in result["levels"]:
        print(f"| {lv['clients']} | " + " | ".join(_ms(lv["stages_p50_ms"][name]) for name in stages) + " |")
    print(f"largest N with p95 < {result['bound_ms']:.0f} ms: {result['largest_clients_p95_under_bound'] or 'none'}")
    soak = result.get("soak")
    if soak:
        print(
            f"soak: {soak['turns_completed']}/{soak['turns']} turns, {soak['errors']} errors; server RSS "
            f"{soak['rss_mb_before']} -> {soak['rss_mb_after']} MiB (growth {soak['rss_growth_mb']} MiB, "
            f"{soak['rss_growth_second_half_mb']} MiB in the second half; "
            f"bound {soak['growth_bound_mb']:.0f} MiB: {'ok' if soak['within_bound'] else 'EXCEEDED'})"
        )


if __name__ == "__main__":
    sys.exit(main())
