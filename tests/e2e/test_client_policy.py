"""The page's own logic in real headless Chromium against the real server with a scripted session (no models, a few
seconds): an answer interrupted before the model finished keeps its words in the transcript view, and a policy close
(1008) shows its reason and is not followed by a reconnect."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.e2e.test_browser import CHROMIUM
from tests.integration.scripted_session import ScriptedSession, scripted_server
from voice import events as ev
from web.config import WebConfig

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (make system-packages)"),
]

DRAFT = "The sea is wide and deep"


class DraftOnlySession(ScriptedSession):
    """Each typed turn gets a draft and no final answer; the next typed turn interrupts it, as voice.turn.session
    does."""

    turn = 0

    async def send_text(self, text: str) -> None:
        emit = self._out.put_nowait
        if self.turn:
            emit(ev.TurnEnd(session=self.id, turn=self.turn, user_text="", answer="", spoken="", interrupted=True,
                            latency_ms={}, stats={}))  # fmt: skip
        self.turn += 1
        emit(ev.Transcript(session=self.id, turn=self.turn, text=text, committed=text, final=True))
        pieces = (("The", True), (" sea", True), (" is", True), (" wide", False), (" and", False), (" deep", False))
        committed = "The sea is"
        emit(ev.DraftUpdate(session=self.id, turn=self.turn, step=2, committed=committed, draft=DRAFT, pieces=pieces))


async def type_message(page, text: str) -> None:
    await page.fill("#text", text)
    await page.click("#send", timeout=5_000)


def test_an_answer_cut_before_the_model_finished_keeps_its_words() -> None:
    from playwright.async_api import async_playwright

    async def scenario() -> dict[str, object]:
        server, _ = scripted_server(WebConfig(port=0), DraftOnlySession)
        async with server, async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--headless"])
            try:
                page = await browser.new_page()
                await page.goto(f"http://127.0.0.1:{server.port}/")
                await page.wait_for_function("() => window.__state === 'ready'", timeout=20_000)
                await type_message(page, "tell me about the sea")
                await page.wait_for_selector("#live-answer:not([hidden])", timeout=10_000)
                await type_message(page, "stop, tell me about the sky")
                bubble = await page.wait_for_selector(".assistant-turn[data-turn='1']", timeout=10_000)
                return {
                    "text": await bubble.inner_text(),
                    "classes": await bubble.get_attribute("class"),
                    "unheard": await page.inner_text(".assistant-turn[data-turn='1'] .unheard"),
                    "users": await page.locator(".user-turn").all_inner_texts(),
                }
            finally:
                await browser.close()

    result = asyncio.run(scenario())
    assert DRAFT in str(result["text"]) and "interrupted" in str(result["classes"])
    assert result["unheard"] == DRAFT  # written, never heard
    assert result["users"] == ["tell me about the sea", "stop, tell me about the sky"]


def test_a_policy_close_shows_its_reason_and_does_not_reconnect() -> None:
    from playwright.async_api import TimeoutError as PlaywrightTimeout
    from playwright.async_api import async_playwright

    strict = WebConfig(port=0, max_messages_per_s=0.1, message_burst=2, messages_close_after=1)

    async def scenario() -> dict[str, object]:
        server, sessions = scripted_server(strict, speech_s=0.1)
        async with server, async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--headless"])
            try:
                page = await browser.new_page()
                await page.goto(f"http://127.0.0.1:{server.port}/")
                await page.wait_for_function("() => window.__state === 'ready'", timeout=20_000)
                for index in range(10):  # the hello and a turn fill the burst; the rest is a flood
                    # the close can land while a message is being typed (the page also reports playback), which
                    # disables the send button: stop flooding then
                    if await page.evaluate("window.__state") == "closed" or await page.is_disabled("#send"):
                        break
                    await page.fill("#text", f"message {index}")
                    with contextlib.suppress(PlaywrightTimeout):
                        await page.click("#send", timeout=2_000)
                await page.wait_for_function("() => window.__state === 'closed'", timeout=10_000)
                await asyncio.sleep(3.0)  # a reconnect would have happened by now (first backoff ~0.5 s)
                return {
                    "code": await page.evaluate("window.__closeCode"),
                    "error": await page.inner_text("#error"),
                    "state": await page.evaluate("window.__state"),
                    "connections": len(sessions),
                }
            finally:
                await browser.close()

    result = asyncio.run(scenario())
    assert result["code"] == 1008 and "message flood" in str(result["error"])
    assert result["state"] == "closed" and result["connections"] == 1
