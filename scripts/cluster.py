"""Voice workers behind HAProxy with one shared LM service, on loopback: start it, or measure it.

    python scripts/cluster.py                      # HAProxy + 2 workers + 1 dlm-serve; Ctrl+C stops them all
    python scripts/cluster.py --clients 4 --turns 2 --compare --json artifacts/cluster.json

With `--clients`, N WebSocket clients stream real LibriVox speech in real time through the balancer
(report_lib.load.run_level, the load test's own clients), the workers' /metrics are scraped, and the histogram's
p50 is set beside the load test's. `--compare` runs the same clients first against one worker with the LM in
process, then one worker using dlm-serve through `--llm-url` (the hop's cost), then the cluster. Every process
shares this machine's cores: on a 2-core machine the figures show correctness and the cost of the hop, not scaling.
`--print-haproxy-config` prints the balancer's configuration for the given worker addresses and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from scripts.report_lib.cluster import Cluster, scrape
from scripts.report_lib.haproxy import Backend, BalancerConfig, haproxy_config
from scripts.report_lib.inputs import recorded_speech
from scripts.report_lib.load import LoadTestError, SpawnedServer, run_level
from scripts.report_lib.page import machine_info
from scripts.report_lib.results import save_json
from web.metrics import histogram_buckets, histogram_quantile


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=0, help="run this many load-test clients, then stop")
    parser.add_argument("--turns", type=int, default=2, help="spoken turns per client")
    parser.add_argument("--compare", action="store_true", help="first 1 worker in-process LM, 1 worker remote LM")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--folder", type=Path, default=Path("artifacts/cluster"), help="configs and logs")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--print-haproxy-config", metavar="HOST:PORT", nargs="+",
                        help="print haproxy.cfg for these workers and exit")
    parser.add_argument("--bind", default="127.0.0.1:8765", help="with --print-haproxy-config: the frontend")
    parser.add_argument("--tls-pem", help="with --print-haproxy-config: certificate + key, TLS at the balancer")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.print_haproxy_config:
        host, _, port = args.bind.rpartition(":")
        workers = [Backend(f"worker{i}", *_host_port(a)) for i, a in enumerate(args.print_haproxy_config)]
        print(haproxy_config(workers, BalancerConfig(bind_host=host, bind_port=int(port), tls_pem=args.tls_pem)))
        return 0
    if not 1 <= args.workers <= 4 or not 0 <= args.clients <= 8 or not 1 <= args.turns <= 10:
        print("cluster: --workers 1..4, --clients 0..8, --turns 1..10", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(_run(args))
    except LoadTestError as error:
        print(f"cluster: {error}", file=sys.stderr)
        return 1
    if result is not None:
        result["command"] = "python scripts/cluster.py " + shlex.join(sys.argv[1:] if argv is None else argv)
        save_json(result, args.json)
    return 0


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def _run(args: argparse.Namespace) -> dict[str, Any] | None:
    clips = [c for c in recorded_speech() if "librivox" in str(c)]
    if args.clients and not clips:
        raise LoadTestError("no speech clips: install pocketsphinx-testdata")
    limit_s = 120.0 + 60.0 * args.turns * args.clients
    result: dict[str, Any] = {"created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine_info(),
                              "clients": args.clients, "turns": args.turns, "runs": {}}
    extra = ["--max-new-tokens", str(args.max_new_tokens)] if args.max_new_tokens else []
    if args.clients and args.compare:
        local = SpawnedServer(extra_args=extra, max_sessions=8)
        _say("1 worker, LM in process: starting")
        await local.start(args.folder / "local.log")
        try:
            result["runs"]["1 worker, in-process LM"] = await _level(local.url, args, clips, limit_s)
        finally:
            await local.stop()
        async with Cluster(args.folder / "one", workers=1, max_new_tokens=args.max_new_tokens) as one:
            direct = f"ws://127.0.0.1:{one.voice[0].port}/ws"  # no balancer: the LM hop alone
            result["runs"]["1 worker, dlm-serve over --llm-url"] = await _level(direct, args, clips, limit_s)
    _say(f"HAProxy + {args.workers} workers + 1 dlm-serve: starting")
    async with Cluster(args.folder / "cluster", workers=args.workers, max_new_tokens=args.max_new_tokens) as cluster:
        _say(f"balancer at {cluster.url} (page: http://127.0.0.1:{cluster.balancer_port}/), LM at {cluster.lm_url}")
        if not args.clients:
            _say("serving until Ctrl+C")
            await asyncio.Event().wait()
        run = await _level(cluster.url, args, clips, limit_s)
        scrapes = [await scrape(f"{cluster.worker_url(i)}/metrics") for i in range(args.workers)]
        merged: dict[float, float] = {}
        for text in scrapes:
            for bound, count in histogram_buckets(text, "voice_to_voice_seconds"):
                merged[bound] = merged.get(bound, 0.0) + count
        run["metrics_voice_to_voice_p50_ms"] = round(histogram_quantile(sorted(merged.items()), 0.5) * 1000, 1)
        run["metrics_voice_to_voice_p95_ms"] = round(histogram_quantile(sorted(merged.items()), 0.95) * 1000, 1)
        run["sessions_per_worker"] = [_sample(text, "voice_sessions_total") for text in scrapes]
        result["runs"][f"HAProxy + {args.workers} workers, dlm-serve"] = run
        _say(f"  /metrics p50 {run['metrics_voice_to_voice_p50_ms']} ms, sessions per worker "
             f"{run['sessions_per_worker']}")
    return result


async def _level(url: str, args: argparse.Namespace, clips: list[Path], limit_s: float) -> dict[str, Any]:
    level = await run_level(url, args.clients, args.turns, clips, limit_s)
    v2v = level["voice_to_voice_ms"]
    _say(f"  {level['turns_completed']}/{level['turns_attempted']} turns, {level['errors']} errors, "
         f"voice-to-voice p50 {v2v['p50']} ms, p95 {v2v['p95']} ms")
    return level


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
