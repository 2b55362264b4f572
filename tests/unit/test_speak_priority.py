"""The speaking stage's render queue: a speculative render never delays a committed phrase (fake voice, no model)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

from voice.speak.stage import SpeakStage, _Render


class SlowVoice:
    """Five 10 ms chunks per text; logs when each render produced its last chunk."""

    sample_rate = 16000

    def __init__(self) -> None:
        self.finished: list[str] = []
        self.closed: list[str] = []
        self.leads: list[tuple[str, bool]] = []  # (text, lead) per synthesis started

    def synthesize(self, text: str, cancel: threading.Event | None = None, lead: bool = False) -> Iterator[bytes]:
        self.leads.append((text, lead))
        try:
            for _ in range(5):
                if cancel is not None and cancel.is_set():
                    return
                time.sleep(0.01)
                yield b"\x00\x00" * 160
            self.finished.append(text)
        finally:
            self.closed.append(text)


async def _events(_event) -> None:
    return None


async def _started(render: _Render) -> None:
    while True:
        if render.chunks:
            return
        await asyncio.sleep(0.001)


def test_a_committed_phrase_overtakes_a_speculative_render_in_progress_which_then_resumes() -> None:
    async def scenario() -> SlowVoice:
        voice = SlowVoice()
        stage = SpeakStage(voice, _events, session="s", turn=1)
        speculative = _Render(2, "later phrase", committed=False)
        stage._speculative[2] = speculative
        stage._enqueue(speculative)
        loop = asyncio.create_task(stage._render_loop())
        await _started(speculative)
        stage._enqueue(_Render(1, "committed phrase", committed=True))
        stage._feeding_done = True
        await asyncio.wait_for(loop, 5)
        return voice

    voice = asyncio.run(scenario())
    assert voice.finished == ["committed phrase", "later phrase"]  # the speculative work resumed, not redone


def test_a_suspended_speculative_render_that_is_dropped_is_closed() -> None:
    async def scenario() -> SlowVoice:
        voice = SlowVoice()
        stage = SpeakStage(voice, _events, session="s", turn=1)
        speculative = _Render(2, "wrong guess", committed=False)
        stage._enqueue(speculative)
        loop = asyncio.create_task(stage._render_loop())
        await _started(speculative)
        stage._enqueue(_Render(1, "committed phrase", committed=True))
        while "committed phrase" not in voice.finished:
            await asyncio.sleep(0.001)
            if speculative in stage._queue:
                stage._drop(speculative)
        stage._feeding_done = True
        stage._worker_wake.set()
        await asyncio.wait_for(loop, 5)
        return voice

    voice = asyncio.run(scenario())
    assert "wrong guess" in voice.closed and "wrong guess" not in voice.finished


def test_the_first_phrase_holds_the_language_model_until_its_first_chunk_and_no_other_phrase_does() -> None:
    """The user waits for the first phrase's first chunk: its synthesis holds the passes (`first_audio_hold`) and is
    a `lead` synthesis (the cores the passes left); the rest of the first phrase and every later phrase render beside
    them."""
    holds: list[tuple[int, int]] = []  # per hold: chunks of phrase 0 when it began and when it ended
    first = _Render(0, "first phrase", committed=True)

    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        began = len(first.chunks)
        yield
        holds.append((began, len(first.chunks)))

    async def scenario(phrase: _Render, with_hold: bool) -> SlowVoice:
        voice = SlowVoice()
        stage = SpeakStage(voice, _events, session="s", turn=1, first_audio_hold=hold if with_hold else None)
        stage._enqueue(phrase)
        stage._enqueue(_Render(1, "second phrase", committed=True))
        stage._feeding_done = True
        await asyncio.wait_for(stage._render_loop(), 5)
        return voice

    voice = asyncio.run(scenario(first, with_hold=True))
    assert holds == [(0, 0)]  # one hold, released as the first chunk came (before it was stored)
    assert len(first.chunks) == 5
    assert voice.leads == [("first phrase", True), ("second phrase", False)]
    # nothing stands aside: no phrase may take the other cores
    voice = asyncio.run(scenario(_Render(0, "first phrase", committed=True), with_hold=False))
    assert voice.leads == [("first phrase", False), ("second phrase", False)]
    # a speculative render of the first phrase (from drafts) shares the cores with the passes, which must go on to
    # commit that phrase before its audio may leave: no hold, not a lead
    holds.clear()
    voice = asyncio.run(scenario(_Render(0, "drafted phrase", committed=False), with_hold=True))
    assert holds == []
    assert ("drafted phrase", False) in voice.leads
