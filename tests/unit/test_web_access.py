"""Server configuration, handshake access checks and static file resolution, without sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from web.access import (
    Denied,
    TokenRedirect,
    check_websocket_access,
    own_origins,
    page_token_redirect,
    request_token,
    token_cookie_name,
)
from web.cli import build_parser
from web.config import STATIC_DIR, WebConfig, WebConfigError
from web.launch import web_config_from_args
from web.static_files import CONTENT_TYPES, http_response, redirect_response, resolve_static

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
    args = build_parser().parse_args(["serve", "--host", "0.0.0.0", "--allow-remote"])
    assert web_config_from_args(args).token == TOKEN


def test_limits_must_be_positive() -> None:
    with pytest.raises(WebConfigError, match="max_sessions"):
        WebConfig(max_sessions=0)
    with pytest.raises(WebConfigError, match="max_message_bytes"):
        WebConfig(max_message_bytes=0)
    with pytest.raises(WebConfigError, match="max_sessions_per_client"):
        WebConfig(max_sessions_per_client=0)
    with pytest.raises(WebConfigError, match="both a certificate and its key"):
        WebConfig(tls_cert=Path("cert.pem"))


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


def test_https_origins_and_the_served_address_are_allowed_by_default() -> None:
    tls = WebConfig(tls_cert=Path("c.pem"), tls_key=Path("k.pem"))
    assert check_websocket_access(tls, 8765, "/ws", {"Origin": "https://127.0.0.1:8765"}) is None
    plain_on_tls = check_websocket_access(tls, 8765, "/ws", {"Origin": "http://127.0.0.1:8765"})
    assert plain_on_tls is not None and plain_on_tls.status == 403
    lan = WebConfig(host="0.0.0.0", allow_remote=True, token=TOKEN, tls_cert=Path("c.pem"), tls_key=Path("k.pem"))
    origins = own_origins(lan, 8765, ["192.168.1.20", "laptop.local", "fe80::1"])
    assert {"https://192.168.1.20:8765", "https://laptop.local:8765", "https://[fe80::1]:8765"} <= origins
    assert "https://0.0.0.0:8765" not in origins
    headers = {"Origin": "https://laptop.local:8765", "Authorization": f"Bearer {TOKEN}"}
    assert check_websocket_access(lan, 8765, "/ws", headers, origins) is None
    assert own_origins(WebConfig(tls_cert=Path("c"), tls_key=Path("k")), 443) >= {"https://localhost"}


def test_a_wildcard_server_accepts_its_page_by_address_but_not_a_foreign_name() -> None:
    lan = WebConfig(host="0.0.0.0", allow_remote=True, token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # an address the server could not list in advance: Origin and Host name the same IP address
    by_address = {**auth, "Origin": "http://10.1.2.3:8765", "Host": "10.1.2.3:8765"}
    assert check_websocket_access(lan, 8765, "/ws", by_address, frozenset()) is None
    # a name is not enough (DNS rebinding points any name at any address), nor an Origin that differs from Host
    by_name = {**auth, "Origin": "http://phone.example:8765", "Host": "phone.example:8765"}
    denied = check_websocket_access(lan, 8765, "/ws", by_name, frozenset())
    assert denied is not None and denied.status == 403 and "--allow-origin" in denied.reason
    other = {**auth, "Origin": "http://10.9.9.9:8765", "Host": "10.1.2.3:8765"}
    assert check_websocket_access(lan, 8765, "/ws", other, frozenset()) is not None
    # a loopback server never matches by Host: only its own loopback origins
    loop = check_websocket_access(WebConfig(), 8765, "/ws", {"Origin": "http://10.1.2.3:8765", "Host": "10.1.2.3:8765"})
    assert loop is not None and loop.status == 403


def test_the_token_moves_from_the_page_url_into_an_http_only_cookie() -> None:
    config = WebConfig(host="0.0.0.0", allow_remote=True, token=TOKEN, tls_cert=Path("c"), tls_key=Path("k"))
    moved = page_token_redirect(config, 8765, f"/?lang=en&token={TOKEN}")
    assert isinstance(moved, TokenRedirect) and moved.location == "/?lang=en"
    assert moved.set_cookie.startswith(f"{token_cookie_name(8765)}={TOKEN};")
    for attribute in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/"):
        assert attribute in moved.set_cookie
    wrong = page_token_redirect(config, 8765, "/?token=guess")
    assert isinstance(wrong, Denied) and wrong.status == 401
    assert page_token_redirect(config, 8765, "/app.js") is None
    plain = page_token_redirect(WebConfig(token=TOKEN), 8765, f"/index.html?token={TOKEN}")
    assert isinstance(plain, TokenRedirect) and plain.location == "/index.html" and "Secure" not in plain.set_cookie
    cookie = {"Cookie": f"other=1; {token_cookie_name(8765)}={TOKEN}"}
    assert request_token("/ws", cookie, token_cookie_name(8765)) == TOKEN
    assert check_websocket_access(config, 8765, "/ws", cookie) is None
    assert check_websocket_access(config, 9999, "/ws", cookie) is not None  # another server's cookie
    odd = WebConfig(token="to;ken with spaces=and,commas")
    odd_cookie = page_token_redirect(odd, 1, f"/?token={'to%3Bken with spaces%3Dand%2Ccommas'}")
    assert isinstance(odd_cookie, TokenRedirect)
    value = odd_cookie.set_cookie.split(";")[0]
    assert request_token("/ws", {"Cookie": value}, token_cookie_name(1)) == odd.token


def test_every_response_carries_the_security_headers() -> None:
    for response in (
        http_response(200, "OK", b"x", "text/html; charset=utf-8"),
        http_response(404, "Not Found", b"", "text/plain"),
        redirect_response("/", "c=1"),
    ):
        csp = response.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert response.headers["Referrer-Policy"] == "no-referrer"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["X-Frame-Options"] == "DENY"
    assert redirect_response("/", "c=1").headers["Location"] == "/"


def test_the_page_has_no_inline_script_or_style_for_the_policy_to_block() -> None:
    from html.parser import HTMLParser

    found: list[str] = []

    class Inline(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            names = {name for name, _ in attrs}
            if tag == "script" and "src" not in names:
                found.append("inline <script>")
            if tag == "style":
                found.append("<style> element")
            found.extend(f"{name} attribute on <{tag}>" for name in names if name == "style" or name.startswith("on"))

    for page in STATIC_DIR.glob("*.html"):
        Inline().feed(page.read_text())
    assert found == []
    for script in STATIC_DIR.glob("*.js"):
        text = script.read_text()
        assert "eval(" not in text and "new Function" not in text and "innerHTML" not in text, script.name
