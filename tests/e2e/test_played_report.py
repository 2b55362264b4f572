"""The browser's `played` reports decide what the history keeps of an interrupted answer, in real headless Chromium
against the real server and the real session (Whisper tiny.en listening; a scripted model and voice, so the timing is
known).

The answer speaks its first phrase, then the model stalls for a few seconds before the second phrase. The page plays
phrase one, waits, and starts phrase two; the user cuts in just after phrase two began. What the user heard is phrase
one. The server's fallback, counting playback from the first sample sent, would count the stall as playing and keep
phrase two as well: only the page's `played` reports get this right.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Sequence

import pytest

from model.chat import ChatMessage, Draft, DraftPiece, GenerationOptions
from tests.e2e.test_browser import CHROMIUM
from voice.engines import Engines
from voice.think.spoken import spoken_answer
from voice.turn.session import Session, SessionConfig
from web.config import WebConfig
from web.server import VoiceServer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (make system-packages)"),
]

RATE = 16_000
WORD_S = 0.25  # each word is a quarter of a second of speech
FIRST = "The first phrase is here."
SECOND = "Then comes a second phrase with eight words."
THIRD = "And a third that is never heard."
STALL_S = 5.0  # the model's pause between the phrases


class StallingLM:
    """Commits the answer word by word, fast, but stalls after each phrase has been committed (its next word is in):
    `STALL_S` after the first, until cancelled after the second."""

    name = "stalling"

    def stream_chat(self, messages: Sequence[ChatMessage], options: GenerationOptions,
                    cancel: threading.Event | None = None) -> Iterator[Draft]:
        words = f"{FIRST} {SECOND} {THIRD}".split()
        stall_after = {len(FIRST.split()) + 1: STALL_S, len(f"{FIRST} {SECOND}".split()) + 1: 60.0}
        cancel = cancel or threading.Event()
        for count in range(1, len(words) + 1):
            if cancel.wait(stall_after.get(count - 1, 0.01)):
                return
            done = count == len(words)
            pieces = tuple(DraftPiece(" " + word, True) for word in words[:count])
            yield Draft(count, pieces, done=done, finish_reason="stop" if done else None, completion_tokens=count)


class WordTones:
    """A voice that says each word as `WORD_S` of a quiet tone (what is heard does not matter, only how long)."""

    sample_rate = RATE

    def synthesize(self, text: str, cancel: threading.Event | None = None, lead: bool = False) -> Iterator[bytes]:
        for _ in text.split():
            if cancel is not None and cancel.is_set():
                return
            yield b"\x00\x04" * int(RATE * WORD_S)


def test_an_interrupted_answer_keeps_what_the_page_reports_as_played() -> None:
    from playwright.async_api import async_playwright

    from voice.listen.asr_models import load_model

    engines = Engines(asr=load_model(None), tts=WordTones(), lm=StallingLM(), load_seconds={})  # type: ignore[arg-type]
    sessions: list[Session] = []

    def new_session() -> Session:
        sessions.append(Session(engines, SessionConfig(generation=spoken_answer(max_new_tokens=64))))
        return sessions[-1]

    first_samples = len(FIRST.split()) * int(RATE * WORD_S)

    async def scenario() -> dict[str, object]:
        server = VoiceServer(None, None, WebConfig(port=0), session_factory=new_session)
        async with server, async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=["--headless", "--autoplay-policy=no-user-gesture-required"])
            try:
                page = await browser.new_page()
                turn_ends: list[str] = []  # the server's turn_end messages, as the page received them
                page.on("websocket", lambda ws: ws.on(
                    "framereceived", lambda frame: turn_ends.append(frame) if '"turn_end"' in str(frame) else None))
                await page.goto(f"http://127.0.0.1:{server.port}/")
                await page.wait_for_function("() => window.__state === 'ready'", timeout=20_000)
                await page.fill("#text", "tell me three things")
                await page.click("#send")
                # phrase one has played and phrase two has begun (a quarter of it): the user cuts in now
                await page.wait_for_function(f"() => window.__playedSamples > {first_samples + RATE // 4}",
                                             timeout=60_000)
                await page.fill("#text", "stop, something else")
                await page.click("#send")
                bubble = await page.wait_for_selector(".assistant-turn[data-turn='1'] .unheard", timeout=10_000)
                return {"unheard": await bubble.inner_text(), "turn_ends": list(turn_ends)}
            finally:
                await browser.close()

    result = asyncio.run(scenario())
    history = [(m.role, m.content) for m in sessions[0].dialogue.history]
    assert history[:2] == [("user", "tell me three things"), ("assistant", FIRST)], history
    assert str(result["unheard"]).strip().startswith("Then comes"), result["unheard"]
    first_end = json.loads(str(result["turn_ends"][0]))
    assert first_end["turn"] == 1 and first_end["interrupted"] and first_end["spoken"] == FIRST, first_end
