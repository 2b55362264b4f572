"""The page in real headless Chromium, with a fake microphone playing real speech, against the real server and models.

Chromium is Debian's /usr/bin/chromium, driven by Playwright for Python; no browser is ever downloaded. The fake
microphone plays a LibriVox clip (resampled to 48 kHz, with silence around it, played once). The server speaks HTTPS
with a self-signed certificate (the `--self-signed` one, made in a temporary folder; the browser is told to accept
it) and wants a token, as it would for a phone on the home network. The test checks what a user would see and hear:
their words as a `.user-turn`, an `.assistant-turn`, and assistant audio actually played by the output worklet; that
the token left the URL for an HttpOnly cookie; the security headers; and that a page on another host name (a second
device, mapped to loopback by Chromium's resolver) is refused unless its origin is allowed. Screenshots land in
artifacts/ (desktop and phone size).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import soundfile

from scripts.report_lib.local_service import free_port
from tests.integration.ws_harness import SPEECH_WORDS, running_server
from voice.audio import load_audio_16k, resample
from voice.engines import Engines
from web.config import WebConfig
from web.tls import self_signed_certificate

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
FAKE_MIC_RATE = 48_000
TOKEN = "e2e-token-0123456789abcdef"
OTHER_DEVICE = "phone.test"  # resolved to 127.0.0.1 by Chromium only

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(400),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (make system-packages)"),
]


def chromium_args(fake_mic: Path) -> list[str]:
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={fake_mic}%noloop",
        "--autoplay-policy=no-user-gesture-required",
        "--ignore-certificate-errors",  # the self-signed certificate; a user compares its fingerprint instead
        f"--host-resolver-rules=MAP {OTHER_DEVICE} 127.0.0.1",
    ]


def fake_microphone_wav(folder: Path) -> Path:
    """Real speech as Chromium's fake capture device wants it: 16-bit PCM WAV, 48 kHz mono, silence around it."""
    from tests.integration.ws_harness import SPEECH_CLIP

    speech = resample(load_audio_16k(SPEECH_CLIP), 16_000, FAKE_MIC_RATE)
    lead, tail = np.zeros(FAKE_MIC_RATE, np.float32), np.zeros(FAKE_MIC_RATE * 20, np.float32)
    path = folder / "fake_mic.wav"
    soundfile.write(path, np.concatenate([lead, speech, tail]), FAKE_MIC_RATE, subtype="PCM_16")
    return path


def test_spoken_turn_over_https_in_real_chromium(engines: Engines, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    fake_mic = fake_microphone_wav(tmp_path)
    cert = self_signed_certificate(tmp_path / "tls", {"localhost", "127.0.0.1", "::1", OTHER_DEVICE})
    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    tls = {"tls_cert": cert.cert_file, "tls_key": cert.key_file, "token": TOKEN}

    async def scenario() -> dict[str, object]:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=chromium_args(fake_mic))
            try:
                async with running_server(engines, WebConfig(port=port, **tls)) as server:
                    result = await spoken_turn(browser, server.port)
                    result["refused_device"] = await other_device_state(browser, port)
                allowed = WebConfig(port=port, allowed_origins=(f"https://{OTHER_DEVICE}:{port}",), **tls)
                async with running_server(engines, allowed):
                    result["allowed_device"] = await other_device_state(browser, port)
                return result
            finally:
                await browser.close()

    result = asyncio.run(scenario())
    heard = set(str(result["user"]).lower().replace(".", "").split())
    assert len(heard & SPEECH_WORDS) >= 4, result["user"]
    assert str(result["assistant"]).strip()
    assert "voice→voice" in str(result["latency"])
    assert isinstance(result["played"], int) and result["played"] > 2000
    assert isinstance(result["received_bytes"], int) and result["received_bytes"] >= 2 * result["played"]
    assert result["errors"] == [] and result["csp_violations"] == []
    assert (ARTIFACTS / "e2e_browser.png").stat().st_size > 10_000
    # the mic sent its native rate, announced in hello
    assert result["input_rate"] in (44_100, 48_000), result["input_rate"]
    # the token left the URL: a 303 set it as an HttpOnly, SameSite=Strict, Secure cookie that scripts cannot read
    assert result["redirect_status"] == 303 and "token" not in str(result["url"])
    assert result["cookie"] == {"httpOnly": True, "secure": True, "sameSite": "Strict"}
    assert result["document_cookie"] == ""
    headers = result["headers"]
    assert isinstance(headers, dict)
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "unsafe-inline" not in headers["content-security-policy"]
    assert headers["referrer-policy"] == "no-referrer" and headers["x-content-type-options"] == "nosniff"
    # a second device (another host name): refused by default, accepted once its origin is allowed
    assert result["refused_device"] != "ready" and "not allowed" in str(result["refused_device"])
    assert result["allowed_device"] == "ready"


async def spoken_turn(browser, port: int) -> dict[str, object]:
    context = await browser.new_context(viewport={"width": 1100, "height": 800})
    page = await context.new_page()
    page_errors: list[str] = []
    csp_violations: list[str] = []
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    page.on("console", lambda msg: csp_violations.append(msg.text) if "Content Security Policy" in msg.text else None)
    response = await page.goto(f"https://127.0.0.1:{port}/?token={TOKEN}")
    assert response is not None
    redirected_from = response.request.redirected_from
    redirect = await redirected_from.response() if redirected_from is not None else None
    # predicates are functions, not expressions: Playwright evaluates an expression with eval(), which the page's CSP
    # (rightly) forbids
    await page.wait_for_function("() => window.__state === 'ready'", timeout=20_000)
    await page.click("#start")
    await page.wait_for_function("() => window.__state === 'listening'", timeout=20_000)
    await page.wait_for_selector(".user-turn", timeout=120_000)
    await page.wait_for_selector(".assistant-turn .latency", timeout=180_000)
    await page.wait_for_function("() => window.__playedSamples > 2000", timeout=60_000)
    cookies = [c for c in await context.cookies() if c["name"].startswith("voice_assistant_token")]
    result = {
        "user": await page.inner_text(".user-turn"),
        "assistant": await page.inner_text(".assistant-turn .answer-text"),
        "latency": await page.inner_text(".assistant-turn .latency"),
        "played": await page.evaluate("window.__playedSamples"),
        "received_bytes": await page.evaluate("window.__receivedAudioBytes"),
        "input_rate": await page.evaluate("window.__inputRate"),
        "errors": page_errors,
        "csp_violations": csp_violations,
        "url": page.url,
        "redirect_status": redirect.status if redirect is not None else None,
        "cookie": {k: cookies[0][k] for k in ("httpOnly", "secure", "sameSite")} if cookies else None,
        "document_cookie": await page.evaluate("document.cookie"),
        "headers": await response.all_headers(),
    }
    await page.screenshot(path=str(ARTIFACTS / "e2e_browser.png"), full_page=True)
    await page.set_viewport_size({"width": 390, "height": 780})
    await page.screenshot(path=str(ARTIFACTS / "e2e_browser_phone.png"))
    await context.close()
    return result


async def other_device_state(browser, port: int) -> str:
    """Open the page as a second device would (another host name) and say how its connection ended up."""
    context = await browser.new_context()
    page = await context.new_page()
    try:
        await page.goto(f"https://{OTHER_DEVICE}:{port}/?token={TOKEN}")
        await page.wait_for_function("() => ['ready', 'closed'].includes(window.__state)", timeout=20_000)
        state = await page.evaluate("window.__state")
        return "ready" if state == "ready" else f"{state}: {await page.inner_text('#error')}"
    finally:
        await context.close()
