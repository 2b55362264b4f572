"""The page in real headless Chromium when its server drains (a deploy): it shows the server's `going_away` message,
reconnects on its own, and is ready again on the server that takes the address over. The sessions are scripted (no
models): what is tested is the page's reaction to the real server's drain."""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.test_browser import CHROMIUM
from tests.integration.scripted_session import scripted_server
from web.config import WebConfig

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (make system-packages)"),
]


def test_a_drained_server_is_explained_and_the_page_reconnects_to_its_successor() -> None:
    from playwright.async_api import async_playwright

    async def scenario() -> dict[str, object]:
        old, _ = scripted_server(WebConfig(port=0), speech_s=0.1)
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--headless"])
            try:
                await old.start()
                port = old.port
                page = await browser.new_page()
                await page.goto(f"http://127.0.0.1:{port}/")
                await page.wait_for_function("() => window.__state === 'ready'", timeout=20_000)
                await old.drain(timeout_s=5)
                await page.wait_for_function("() => window.__closeCode === 1001", timeout=10_000)
                error = await page.inner_text("#error")
                new, sessions = scripted_server(WebConfig(port=port), speech_s=0.1)
                async with new:
                    await page.wait_for_function("() => window.__state === 'ready'", timeout=20_000)
                    return {"error": error, "sessions_on_new": len(sessions)}
            finally:
                await browser.close()

    result = asyncio.run(scenario())
    assert "going away" in str(result["error"]) and "reconnecting" in str(result["error"]), result["error"]
    assert result["sessions_on_new"] == 1
