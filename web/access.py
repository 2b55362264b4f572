"""Who may open the WebSocket: token and Origin checks on the opening handshake, without I/O.

Two threats: anyone on the network reaching a server that listens beyond loopback (answered by a mandatory token), and a
hostile web page in the user's own browser opening a socket to 127.0.0.1 (cross-site WebSocket hijacking, answered by
checking `Origin`). Clients that are not browsers send no Origin and are judged by the token alone.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from web.config import WebConfig


@dataclass(frozen=True, slots=True)
class Denied:
    status: int
    reason: str


def own_origins(config: WebConfig, port: int) -> frozenset[str]:
    """The origins of pages this server itself serves."""
    hosts = {"127.0.0.1", "localhost", "[::1]"}
    if config.host not in ("0.0.0.0", "::", ""):  # a wildcard address is never what a browser shows as the origin
        hosts.add(f"[{config.host}]" if ":" in config.host else config.host)
    return frozenset(f"http://{h}:{port}" for h in hosts) | frozenset(o.rstrip("/") for o in config.allowed_origins)


def request_token(path: str, headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    values = parse_qs(urlsplit(path).query).get("token")
    return values[0] if values else None


def check_websocket_access(config: WebConfig, port: int, path: str, headers: Mapping[str, str]) -> Denied | None:
    """None when the handshake may proceed, else the HTTP status and reason to refuse it with."""
    origin = headers.get("Origin")
    if origin is not None and origin.rstrip("/") not in own_origins(config, port):
        return Denied(403, f"origin {origin[:100]!r} is not allowed")
    if config.token is not None:
        given = request_token(path, headers)
        if given is None:
            return Denied(401, "a token is required: add ?token=... or an 'Authorization: Bearer' header")
        if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), config.token.encode("utf-8")):
            return Denied(401, "invalid token")
    return None
