"""Serving the browser client's files from web/static/ on the same port as the WebSocket.

The page is a handful of small files, so they are read on request (no cache to go stale while developing) and never
outside the static folder, whatever the path says.
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


def http_response(status: int, reason: str, body: bytes, content_type: str) -> Response:
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Length", str(len(body))),
            ("Content-Type", content_type),
            ("Cache-Control", "no-cache"),
            ("X-Content-Type-Options", "nosniff"),
        ]
    )
    return Response(status, reason, headers, body)


def static_response(static_dir: Path, request_path: str) -> Response:
    file = resolve_static(static_dir, request_path)
    if file is None:
        return http_response(404, "Not Found", b"not found\n", "text/plain; charset=utf-8")
    return http_response(200, "OK", file.read_bytes(), CONTENT_TYPES[file.suffix])
