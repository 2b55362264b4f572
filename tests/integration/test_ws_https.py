"""HTTPS and WSS with the self-signed certificate, the page's headers, the token's move into a cookie and the origin
rules, over real loopback sockets with a scripted session (no models)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.integration.scripted_session import scripted_server
from tests.integration.ws_harness import Received, collect
from web.access import token_cookie_name
from web.config import WebConfig
from web.tls import Certificate, self_signed_certificate

pytestmark = [pytest.mark.timeout(60)]

TOKEN = "https-test-token-0123456789"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"), {"localhost", "127.0.0.1", "127.0.0.2", "::1"})


def client_context(cert: Certificate) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert.cert_file))


def test_page_over_https_with_headers_and_the_token_moved_into_a_cookie(cert: Certificate) -> None:
    config = WebConfig(port=0, tls_cert=cert.cert_file, tls_key=cert.key_file, token=TOKEN)

    async def scenario() -> dict[str, object]:
        server, _ = scripted_server(config)
        async with server, httpx.AsyncClient(verify=client_context(cert)) as http:
            base = f"https://127.0.0.1:{server.port}"
            first = await http.get(f"{base}/?token={TOKEN}")
            wrong = await http.get(f"{base}/?token=not-the-token-at-all")
            page = await http.get(f"{base}/")
            cookie = first.cookies.get(token_cookie_name(server.port))
            ctx = client_context(cert)
            headers = {"Cookie": f"{token_cookie_name(server.port)}={cookie}"}
            async with connect(f"wss://127.0.0.1:{server.port}/ws", ssl=ctx, additional_headers=headers) as ws:
                ready = (await collect(ws, Received(), until="ready")).ready()
            with pytest.raises(InvalidStatus) as no_cookie:
                async with connect(f"wss://127.0.0.1:{server.port}/ws", ssl=ctx):
                    pass
            return {
                "first": (first.status_code, first.headers.get("location"), first.headers.get("set-cookie", "")),
                "wrong": (wrong.status_code, "set-cookie" in wrong.headers),
                "page": page,
                "cookie": cookie,
                "ready": ready,
                "no_cookie": no_cookie.value.response.status_code,
            }

    result = asyncio.run(scenario())
    status, location, set_cookie = result["first"]  # type: ignore[misc]
    assert status == 303 and location == "/"
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Secure" in set_cookie
    assert result["cookie"] == TOKEN
    assert result["wrong"] == (401, False)
    page = result["page"]
    assert isinstance(page, httpx.Response) and page.status_code == 200 and 'id="start"' in page.text
    csp = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert page.headers["referrer-policy"] == "no-referrer" and page.headers["x-content-type-options"] == "nosniff"
    assert result["ready"]["protocol"] == 1  # type: ignore[index]
    assert result["no_cookie"] == 401


def test_origins_own_address_another_name_and_the_allowlist(cert: Certificate) -> None:
    tls = {"tls_cert": cert.cert_file, "tls_key": cert.key_file, "token": TOKEN}
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def attempt(port: int, host: str, origin: str) -> Received:
        ctx = client_context(cert)
        async with connect(f"wss://{host}:{port}/ws", ssl=ctx, origin=origin, additional_headers=auth) as ws:
            return await collect(ws, Received(), until="ready", timeout_s=10)

    async def scenario() -> dict[str, Received]:
        results = {}
        # bound to every interface: the page's own address works without --allow-origin, a foreign name does not
        server, _ = scripted_server(WebConfig(port=0, host="0.0.0.0", allow_remote=True, **tls))
        async with server:
            port = server.port
            results["own_address"] = await attempt(port, "127.0.0.2", f"https://127.0.0.2:{port}")
            results["loopback"] = await attempt(port, "127.0.0.1", f"https://localhost:{port}")
            results["other_name"] = await attempt(port, "127.0.0.1", f"https://phone.example:{port}")
            results["plain_http"] = await attempt(port, "127.0.0.2", f"http://127.0.0.2:{port}")
        allowed = WebConfig(port=port, allowed_origins=(f"https://phone.example:{port}",), **tls)
        server, _ = scripted_server(allowed)
        async with server:
            results["allowed_name"] = await attempt(port, "127.0.0.1", f"https://phone.example:{port}")
        return results

    results = asyncio.run(scenario())
    for ok in ("own_address", "loopback", "allowed_name"):
        assert results[ok].ready()["protocol"] == 1 and results[ok].close_code is None, ok
    for refused in ("other_name", "plain_http"):
        received = results[refused]
        assert not received.of_type("ready"), refused
        # a browser would see only 1006 for an HTTP refusal: the reason travels in a 1008 close instead
        assert received.close_code == 1008 and "is not allowed" in received.close_reason, refused
        assert "--allow-origin" in received.close_reason


def test_serve_self_signed_makes_the_certificate_once_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import web.cli
    import web.launch

    served: list[WebConfig] = []
    monkeypatch.setenv("VOICE_ASSISTANT_CACHE", str(tmp_path))
    monkeypatch.setattr(web.cli, "_load", lambda args: None)
    monkeypatch.setattr(web.launch, "run_server", lambda engines, session, web_config: served.append(web_config))
    assert web.cli.main(["serve", "--self-signed"]) == 0
    assert web.cli.main(["serve", "--self-signed", "--port", "9443"]) == 0
    err = capsys.readouterr().err
    assert "made a self-signed certificate for" in err and "reusing a self-signed certificate" in err
    first, second = served
    assert first.tls_cert == second.tls_cert == tmp_path / "tls" / "self-signed-cert.pem" and first.scheme == "https"
    assert web.cli.main(["serve", "--self-signed", "--tls-cert", "c.pem", "--tls-key", "k.pem"]) == 2
