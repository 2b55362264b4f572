"""Server configuration, handshake access checks and static file resolution, without sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from web.access import check_websocket_access, request_token
from web.config import STATIC_DIR, WebConfig, WebConfigError
from web.static_files import CONTENT_TYPES, resolve_static

TOKEN = "s3cret-token-0123456789"


def test_defaults_are_loopback_without_token() -> None:
    config = WebConfig()
    assert config.host == "127.0.0.1" and config.token is None and not config.allow_remote
    assert check_websocket_access(config, 8765, "/ws", {}) is None
    assert check_websocket_access(config, 8765, "/ws", {"Origin": "http://127.0.0.1:8765"}) is None
    assert check_websocket_access(config, 8765, "/ws", {"Origin": "http://localhost:8765"}) is None


def test_non_loopback_host_needs_allow_remote_and_a_token() -> None:
    with pytest.raises(WebConfigError, match="allow_remote"):
        WebConfig(host="0.0.0.0")
    with pytest.raises(WebConfigError, match="requires a token"):
        WebConfig(host="0.0.0.0", allow_remote=True)
    with pytest.raises(WebConfigError, match="at least 16"):
        WebConfig(host="0.0.0.0", allow_remote=True, token="short")
    assert WebConfig(host="0.0.0.0", allow_remote=True, token=TOKEN).token == TOKEN


def test_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICE_ASSISTANT_TOKEN", TOKEN)
    assert WebConfig.from_env(host="0.0.0.0", allow_remote=True).token == TOKEN


def test_limits_must_be_positive() -> None:
    with pytest.raises(WebConfigError, match="max_sessions"):
        WebConfig(max_sessions=0)
    with pytest.raises(WebConfigError, match="max_message_bytes"):
        WebConfig(max_message_bytes=2_000_000, hard_max_message_bytes=1_000_000)


def test_foreign_origin_is_refused_even_on_loopback() -> None:
    denied = check_websocket_access(WebConfig(), 8765, "/ws", {"Origin": "https://evil.example"})
    assert denied is not None and denied.status == 403 and "evil.example" in denied.reason
    wrong_port = check_websocket_access(WebConfig(), 8765, "/ws", {"Origin": "http://127.0.0.1:9999"})
    assert wrong_port is not None and wrong_port.status == 403
    allowed = WebConfig(allowed_origins=("https://app.example/",))
    assert check_websocket_access(allowed, 8765, "/ws", {"Origin": "https://app.example"}) is None


def test_token_by_query_or_bearer_header() -> None:
    config = WebConfig(host="0.0.0.0", allow_remote=True, token=TOKEN, allowed_origins=("https://app.example",))
    missing = check_websocket_access(config, 8765, "/ws", {})
    assert missing is not None and missing.status == 401 and "token is required" in missing.reason
    wrong = check_websocket_access(config, 8765, "/ws?token=nope", {})
    assert wrong is not None and wrong.reason == "invalid token"
    assert check_websocket_access(config, 8765, f"/ws?token={TOKEN}", {}) is None
    assert check_websocket_access(config, 8765, "/ws", {"Authorization": f"Bearer {TOKEN}"}) is None
    assert check_websocket_access(config, 8765, f"/ws?token={TOKEN}", {"Origin": "https://app.example"}) is None
    bad_origin = check_websocket_access(config, 8765, f"/ws?token={TOKEN}", {"Origin": "https://evil.example"})
    assert bad_origin is not None and bad_origin.status == 403
    assert request_token("/ws?a=1&token=x%20y", {}) == "x y"


def test_static_files_resolve_inside_the_static_folder_only(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<h1>hi</h1>")
    (tmp_path / "app.js").write_text("1")
    (tmp_path / "secret.key").write_text("no")
    (tmp_path.parent / "outside.html").write_text("no")
    assert resolve_static(tmp_path, "/") == (tmp_path / "index.html").resolve()
    assert resolve_static(tmp_path, "/app.js?v=2") == (tmp_path / "app.js").resolve()
    for path in ["/../outside.html", "/%2e%2e/outside.html", "/secret.key", "/missing.js", "/a\\b.js", "/x%00.js"]:
        assert resolve_static(tmp_path, path) is None, path


def test_the_shipped_page_is_complete() -> None:
    names = {"index.html", "app.js", "style.css", "mic-worklet.js", "player-worklet.js"}
    for name in names:
        file = resolve_static(STATIC_DIR, "/" + name)
        assert file is not None, name
        assert file.suffix in CONTENT_TYPES
    html = (STATIC_DIR / "index.html").read_text()
    assert 'id="start"' in html and "app.js" in html and "style.css" in html
