"""Starting the WebSocket server as a process: the `serve` command's web settings (flags, the token from the
environment, a self-signed certificate), the process-wide set-up (malloc arenas, worker threads, signals) and the
notes printed once it listens. The connections themselves are web/server.py's job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from model.disk_cache import cache_root
from voice.cancellation import cancel_and_wait
from web.config import TOKEN_ENV, WebConfig
from web.native_memory import limit_malloc_arenas
from web.server import VoiceServer
from web.tls import fingerprint_sha256, local_addresses, names_to_cover, self_signed_certificate

if TYPE_CHECKING:
    from voice.engines import Engines
    from voice.turn.session import SessionConfig

MALLOC_ARENAS = 2  # see web.native_memory.limit_malloc_arenas
THREADS_PER_SESSION = 6  # VAD, an ASR decode, an answer (plus a cancelled one winding down), two TTS renders


def web_config_from_args(args: argparse.Namespace) -> WebConfig:
    """The `serve` command's flags as a WebConfig; with `--self-signed`, makes (or reuses) the certificate first."""
    cert, key = args.tls_cert, args.tls_key
    if args.self_signed:
        if cert or key:
            raise ValueError("use either --self-signed or --tls-cert/--tls-key, not both")
        made = self_signed_certificate(cache_root() / "tls", names_to_cover(args.host))
        cert, key = made.cert_file, made.key_file
        print(
            f"{'made' if made.created else 'reusing'} a self-signed certificate for {', '.join(made.names)}",
            file=sys.stderr,
            flush=True,
        )
    return WebConfig(
        host=args.host,
        port=args.port,
        allow_remote=args.allow_remote,
        token=args.token or os.environ.get(TOKEN_ENV) or None,
        allowed_origins=tuple(args.allow_origin),
        max_sessions=args.max_sessions,
        max_sessions_per_client=args.max_sessions_per_client,
        tls_cert=cert,
        tls_key=key,
    )


async def serve(
    engines: Engines,
    session_config: SessionConfig,
    web_config: WebConfig,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until `stop` is set (or the task is cancelled), then shut down gracefully."""
    stop = stop or asyncio.Event()
    async with VoiceServer(engines, session_config, web_config):
        await stop.wait()


def worker_threads(max_sessions: int) -> int:
    """Threads for blocking work (`asyncio.to_thread`) when `max_sessions` sessions are open.

    Sessions queue for the shared models inside worker threads (see `model.fair_lock`), and a thread waiting for a
    model holds its worker. asyncio's default pool has only cpu_count + 4 workers (6 on 2 cores): eight sessions
    waiting for the LM filled it, so a session's 1 ms VAD step waited seconds behind them, its socket stopped being
    read, and its audio then arrived in a burst that the rate limit dropped. Idle or waiting threads cost no CPU.
    """
    return THREADS_PER_SESSION * max_sessions + 4


def start_notes(config: WebConfig, port: int) -> list[str]:
    """What a user needs to reach the page from another device: its addresses and the certificate's fingerprint."""
    notes = []
    if config.host in ("0.0.0.0", "::", ""):
        addresses = sorted(a for a in local_addresses() if not a.startswith(("127.", "::1")))
        hosts = [f"[{a}]" if ":" in a else a for a in addresses]
        notes += [f"on this network: {config.scheme}://{host}:{port}/" for host in hosts]
    if config.tls_cert is not None:
        notes.append(f"certificate SHA-256 fingerprint {fingerprint_sha256(config.tls_cert.read_bytes())}")
    if config.token is not None:
        notes.append("open the page once as /?token=YOUR_TOKEN; it then keeps the token in a cookie")
    return notes


def run_server(engines: Engines, session_config: SessionConfig, web_config: WebConfig) -> None:
    """Blocking entry point for `voice-assistant serve`: serve until a signal. SIGTERM (a deploy, systemd, a balancer's
    rolling restart) drains: new sessions are refused, turns in flight end, then each socket closes with 1001 after an
    `error` event saying why (web.server.VoiceServer.drain). SIGINT, or a second SIGTERM, stops at once: every session
    is closed and each socket gets 1001 with a reason. Prints the page's URL once it is listening."""

    async def main() -> None:
        stop = asyncio.Event()
        drain = asyncio.Event()
        loop = asyncio.get_running_loop()
        limit_malloc_arenas(MALLOC_ARENAS)
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=worker_threads(web_config.max_sessions), thread_name_prefix="voice-work")
        )
        loop.add_signal_handler(signal.SIGTERM, lambda: stop.set() if drain.is_set() else drain.set())
        loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            async with VoiceServer(engines, session_config, web_config) as server:
                print(f"voice-assistant: serving {server.url}", flush=True)
                for line in start_notes(web_config, server.port):
                    print(f"voice-assistant: {line}", flush=True)
                await _first_of(stop.wait(), drain.wait())
                if not stop.is_set():
                    print(f"voice-assistant: draining ({server.active_sessions} sessions)", flush=True)
                    await _first_of(stop.wait(), server.drain())
                print("voice-assistant: shutting down", flush=True)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    asyncio.run(main())


async def _first_of(*waits: Coroutine[Any, Any, Any]) -> None:
    """Run the coroutines until one ends; cancel the others."""
    tasks = [asyncio.create_task(wait, name=f"serve-wait-{i}") for i, wait in enumerate(waits)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(*tasks)
