"""A voice session whose LM is a separate `dlm-serve` process (the bundled model) on loopback: the service killed
mid-answer fails that turn with `lm_unavailable`, a turn while it is down fails fast the same way, and the session
answers again, on its own, once the service is back on the same port."""

from __future__ import annotations

import asyncio
import time

import pytest

from model.chat.client import OpenAIChatModel
from scripts.report_lib.local_service import free_port
from tests.integration.api_harness import start_lm_service
from voice.engines import Engines
from voice.events import AnswerDone, DraftUpdate, ErrorEvent, Event, TurnEnd
from voice.listen.asr_models import load_model
from voice.speak.tts import load_synthesizer
from voice.think.spoken import spoken_answer
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.session import Session, SessionConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SERVED = "voice-lm"


async def next_turn_outcome(session_events: asyncio.Queue[Event], turn_timeout_s: float = 90) -> list[Event]:
    """Events up to and including the turn's end (TurnEnd; a failed turn's error comes before it)."""
    seen: list[Event] = []
    async with asyncio.timeout(turn_timeout_s):
        while True:
            event = await session_events.get()
            seen.append(event)
            if isinstance(event, TurnEnd):
                return seen


def test_lm_service_killed_mid_answer_fails_the_turn_and_the_session_recovers_when_it_is_back() -> None:
    port = free_port()
    service = start_lm_service(port, SERVED)
    remote = OpenAIChatModel(f"http://127.0.0.1:{port}/v1", SERVED)
    engines = Engines(asr=load_model(None), tts=load_synthesizer(), lm=remote, load_seconds={})
    config = SessionConfig(turn_taking=TurnTakingConfig(early_answer=False), wait_for_playback=False,
                           generation=spoken_answer(max_new_tokens=48))

    async def scenario() -> tuple[list[Event], list[Event], float, list[Event]]:
        nonlocal service
        session = Session(engines, config)
        await session.start()
        events: asyncio.Queue[Event] = asyncio.Queue()

        async def pump() -> None:
            async for event in session.events():
                await events.put(event)

        pumping = asyncio.create_task(pump(), name="test-session-events")
        try:
            await session.send_text("Tell me a long story about the sea and the ships on it.")
            killed: list[Event] = []
            async with asyncio.timeout(90):
                while not any(isinstance(e, DraftUpdate) for e in killed):
                    killed.append(await events.get())
            service.kill()  # mid-answer: its first drafts arrived, the rest never will
            service.wait()
            killed += await next_turn_outcome(events)

            started = time.monotonic()
            await session.send_text("Are you there?")
            down = await next_turn_outcome(events)
            down_s = time.monotonic() - started

            service = start_lm_service(port, SERVED)
            await session.send_text("What is the capital of France?")
            back = await next_turn_outcome(events)
            return killed, down, down_s, back
        finally:
            await session.close()
            await asyncio.wait_for(pumping, 30)

    try:
        killed, down, down_s, back = asyncio.run(scenario())
    finally:
        service.kill()
        service.wait()

    errors = [e for e in killed if isinstance(e, ErrorEvent)]
    assert [e.code for e in errors] == ["lm_unavailable"], killed
    assert "next one tries again" in errors[0].message
    assert not any(isinstance(e, AnswerDone) for e in killed)  # no half answer passed off as a whole one
    assert [e.code for e in down if isinstance(e, ErrorEvent)] == ["lm_unavailable"], down
    assert down_s < 10  # connection refused: fails in seconds, not after the turn's 60 s limit
    answered = [e for e in back if isinstance(e, AnswerDone)]
    assert answered and answered[0].text.strip(), [type(e).__name__ for e in back if type(e).__name__ != "AudioOut"]
    assert not any(isinstance(e, ErrorEvent) for e in back), back
    assert isinstance(back[-1], TurnEnd) and back[-1].answer.strip()
