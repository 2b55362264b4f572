"""The page in real headless Chromium, with a fake microphone playing real speech, against the real server and models.

Chromium is Debian's /usr/bin/chromium, driven by Playwright for Python; no browser is ever downloaded. The fake
microphone plays a LibriVox clip (resampled to 48 kHz, with silence around it, played once). The test checks what a
user would see and hear: their words as a `.user-turn`, an `.assistant-turn`, and assistant audio actually played by
the output worklet. Screenshots land in artifacts/ (desktop and phone size).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tests.integration.ws_harness import SPEECH_WORDS, load_test_engines, running_server
from voice.engines import Engines
from voice.io.audio import load_audio_16k, resample
from web.config import WebConfig

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
FAKE_MIC_RATE = 48_000

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
    ]


def fake_microphone_wav(folder: Path) -> Path:
    """Real speech as Chromium's fake capture device wants it: 16-bit PCM WAV, 48 kHz mono, silence around it."""
    from tests.integration.ws_harness import SPEECH_CLIP

    speech = resample(load_audio_16k(SPEECH_CLIP), 16_000, FAKE_MIC_RATE)
    lead, tail = np.zeros(FAKE_MIC_RATE, np.float32), np.zeros(FAKE_MIC_RATE * 20, np.float32)
    path = folder / "fake_mic.wav"
    soundfile.write(path, np.concatenate([lead, speech, tail]), FAKE_MIC_RATE, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Engines:
    return load_test_engines(tmp_path_factory.mktemp("lm"))


def test_spoken_turn_in_real_chromium(engines: Engines, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    fake_mic = fake_microphone_wav(tmp_path)
    ARTIFACTS.mkdir(exist_ok=True)

    async def scenario() -> dict[str, object]:
        async with running_server(engines, WebConfig(port=0)) as server, async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=chromium_args(fake_mic))
            try:
                page = await browser.new_page(viewport={"width": 1100, "height": 800})
                page_errors: list[str] = []
                page.on("pageerror", lambda error: page_errors.append(str(error)))
                await page.goto(f"http://127.0.0.1:{server.port}/")
                await page.wait_for_function("window.__state === 'ready'", timeout=20_000)
                await page.click("#start")
                await page.wait_for_function("window.__state === 'listening'", timeout=20_000)
                await page.wait_for_selector(".user-turn", timeout=120_000)
                await page.wait_for_selector(".assistant-turn .latency", timeout=180_000)
                await page.wait_for_function("window.__playedSamples > 2000", timeout=60_000)
                result = {
                    "user": await page.inner_text(".user-turn"),
                    "assistant": await page.inner_text(".assistant-turn .answer-text"),
                    "latency": await page.inner_text(".assistant-turn .latency"),
                    "played": await page.evaluate("window.__playedSamples"),
                    "received_bytes": await page.evaluate("window.__receivedAudioBytes"),
                    "errors": page_errors,
                }
                await page.screenshot(path=str(ARTIFACTS / "e2e_browser.png"), full_page=True)
                await page.set_viewport_size({"width": 390, "height": 780})
                await page.screenshot(path=str(ARTIFACTS / "e2e_browser_phone.png"))
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
    assert result["errors"] == []
    assert (ARTIFACTS / "e2e_browser.png").stat().st_size > 10_000
