"""Serving the browser client's files from web/static/ on the same port as the WebSocket.

The page is a handful of small files, so they are read on request (no cache to go stale while developing) and never
outside the static folder, whatever the path says. Every response carries the security headers: the page runs only
its own scripts and styles (no inline script or style anywhere in web/static, so the policy needs no 'unsafe-inline'),
cannot be framed (clickjacking a microphone button), sends no Referer, and its types are not sniffed.
"""

from __future__ import annotations

import email.utils
from pathlib import Path
from urllib.parse import unquote, urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Response

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
    ".md": "text/markdown; charset=utf-8",
}


def resolve_static(static_dir: Path, request_path: str) -> Path | None:
    """The file a GET path names inside `static_dir`, or None (missing, a folder, or an escape attempt)."""
    path = unquote(urlsplit(request_path).path)
    if path in ("", "/"):
        path = "/index.html"
    if "\x00" in path or "\\" in path:
        return None
    root = static_dir.resolve()
    candidate = (root / path.lstrip("/")).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        return None
    if candidate.suffix not in CONTENT_TYPES:
        return None
    return candidate


# connect-src 'self' covers ws: and wss: to the page's own host and port (CSP level 3); worklets load as scripts.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "media-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Frame-Options", "DENY"),  # frame-ancestors for browsers that predate it
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
    ("Permissions-Policy", "microphone=(self), camera=(), geolocation=()"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
)


def http_response(
    status: int, reason: str, body: bytes, content_type: str, extra: tuple[tuple[str, str], ...] = ()
) -> Response:
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Length", str(len(body))),
            ("Content-Type", content_type),
            ("Cache-Control", "no-cache"),
            *SECURITY_HEADERS,
            *extra,
        ]
    )
    return Response(status, reason, headers, body)


def redirect_response(location: str, set_cookie: str) -> Response:
    """303 to `location`, setting a cookie on the way (the token moving from the URL into a cookie)."""
    extra: tuple[tuple[str, str], ...] = (("Location", location),)
    if set_cookie:
        extra = (*extra, ("Set-Cookie", set_cookie))
    return http_response(303, "See Other", b"", "text/plain; charset=utf-8", extra)


def static_response(static_dir: Path, request_path: str) -> Response:
    file = resolve_static(static_dir, request_path)
    if file is None:
        return http_response(404, "Not Found", b"not found\n", "text/plain; charset=utf-8")
    return http_response(200, "OK", file.read_bytes(), CONTENT_TYPES[file.suffix])
