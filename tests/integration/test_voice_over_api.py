"""A full voice turn whose language model is a `dlm-serve` on loopback, reached through the pipeline's OpenAI client.

Real speech in (Whisper tiny.en), the answer from the server's diffusing stream, speech out (Piper): the same Session
that drives the local model, with only the `ChatModel` swapped for `OpenAIChatModel`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from model.chat.client import OpenAIChatModel
from model.server import ServerConfig
from tests.integration.api_harness import serve, tiny_chat_model
from tests.integration.ws_harness import speech_pcm16
from voice.audio import stream_pcm16
from voice.engines import Engines
from voice.events import AnswerDone, AudioOut, DraftUpdate, Event, Transcript, TurnEnd
from voice.listen.asr_models import load_model
from voice.speak.tts import load_synthesizer
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.session import Session, SessionConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_spoken_turn_answered_by_dlm_serve_through_the_openai_client(tmp_path: Path) -> None:
    model = tiny_chat_model(tmp_path, block_length=8)
    with serve(model, ServerConfig(api_key="a-test-key-0123456789")) as running:
        remote = OpenAIChatModel(running.api_url, model.name, api_key="a-test-key-0123456789")
        engines = Engines(asr=load_model(None), tts=load_synthesizer(), lm=remote, load_seconds={})

        async def scenario() -> list[Event]:
            config = SessionConfig(turn_taking=TurnTakingConfig(early_answer=False), wait_for_playback=False)
            session = Session(engines, config)
            await session.start()
            events: list[Event] = []
            turn_over = asyncio.Event()

            async def collect() -> None:
                async for event in session.events():
                    events.append(event)
                    if isinstance(event, TurnEnd):
                        turn_over.set()

            collector = asyncio.create_task(collect())
            await stream_pcm16(session.feed_audio, speech_pcm16())
            await session.end_of_audio()
            async with asyncio.timeout(120):
                await turn_over.wait()
            await session.close()
            await collector
            return events

        events = asyncio.run(scenario())
        completed = running.scheduler.stats.completed

    final = next(e for e in events if isinstance(e, Transcript) and e.final)
    assert "young man" in final.text.lower()
    drafts = [e for e in events if isinstance(e, DraftUpdate)]
    assert len(drafts) > 1, "the diffusing stream must arrive as several whole drafts"
    answer = next(e for e in events if isinstance(e, AnswerDone))
    assert answer.text and answer.text == drafts[-1].committed.strip()
    assert sum(len(e.pcm) for e in events if isinstance(e, AudioOut)) > 0
    end = next(e for e in events if isinstance(e, TurnEnd))
    assert not end.interrupted and end.latency_ms["voice_to_voice"] > 0
    assert completed >= 1
