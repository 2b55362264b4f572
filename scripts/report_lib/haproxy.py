"""The HAProxy configuration in front of voice workers: pure text from a few settings, no I/O.

WebSockets pass through HAProxy's HTTP mode as an upgraded tunnel (`timeout tunnel` then governs the session), and
`leastconn` sends each new session to the worker with the fewest open ones: sessions are long and unequal, so
round-robin would pile them up. Workers are checked on `/readyz`, which answers 503 while a worker drains or is full,
so a draining worker gets no new session while its own sessions finish their turns. A handshake that still reaches
one (between two checks) gets 503 and is retried once on another worker (`retry-on 503`, `option redispatch`).
Because every session then arrives from the balancer's address, the per-address session limit moves here (a
stick table counting each client's open connections); the workers get a per-address limit as high as their total.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BalancerConfig:
    bind_host: str = "127.0.0.1"
    bind_port: int = 8765
    check_interval_ms: int = 500  # how soon a drained or dead worker stops getting sessions
    max_sessions_per_client: int = 3
    session_timeout_s: int = 600  # an open WebSocket with no traffic either way for this long is closed
    tls_pem: str | None = None  # certificate + key in one PEM file: TLS ends at the balancer


def haproxy_binary() -> str | None:
    """The `haproxy` program: on PATH, else where Debian's package puts it (/usr/sbin, often not on a user's PATH)."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")


def haproxy_config(workers: Sequence[Backend], config: BalancerConfig) -> str:
    """haproxy.cfg for `workers` behind one frontend."""
    if not workers:
        raise ValueError("the balancer needs at least one worker")
    tls = f" ssl crt {config.tls_pem}" if config.tls_pem else ""
    servers = "\n".join(f"    server {w.name} {w.host}:{w.port} check" for w in workers)
    return f"""\
global
    maxconn 1024

defaults
    mode http
    timeout connect 2s
    timeout client {config.session_timeout_s}s
    timeout server {config.session_timeout_s}s
    timeout tunnel {config.session_timeout_s}s
    timeout http-request 10s
    option redispatch
    retries 2
    retry-on conn-failure empty-response 503

frontend voice
    bind {config.bind_host}:{config.bind_port}{tls}
    stick-table type ip size 100k expire 60s store conn_cur
    http-request track-sc0 src
    http-request deny deny_status 429 if {{ sc_conn_cur(0) gt {config.max_sessions_per_client} }}
    default_backend workers

backend workers
    balance leastconn
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter {config.check_interval_ms}ms fall 1 rise 2
{servers}
"""
