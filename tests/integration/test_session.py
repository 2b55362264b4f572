"""The voice session with real models: a conversation from files, barge-in, cancellation, a failing stage."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from model.chat import ChatMessage, ChatModel, Draft, GenerationOptions
from model.errors import ModelError
from tests.integration.ws_harness import speech_pcm16
from voice.audio import stream_pcm16
from voice.engines import Engines
from voice.events import (
    AnswerDone,
    AudioOut,
    Clear,
    ErrorEvent,
    Event,
    LmFirstPass,
    PhraseCommitted,
    SpeechStart,
    TurnEnd,
)
from voice.modes.files import run_files, write_wav
from voice.speak.speculator import SpeculatorConfig
from voice.think.spoken import spoken_answer
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.session import Session, SessionConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class RecordingModel:
    """The real model, with every prompt it was given kept for inspection."""

    def __init__(self, inner: ChatModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.prompts: list[list[ChatMessage]] = []

    def stream_chat(
        self, messages: Sequence[ChatMessage], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Draft]:
        self.prompts.append(list(messages))
        return self.inner.stream_chat(messages, options, cancel)


class FailsOnce(RecordingModel):
    """The real model, except that its first answer fails the way a broken checkpoint would."""

    def stream_chat(
        self, messages: Sequence[ChatMessage], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Draft]:
        self.prompts.append(list(messages))
        if len(self.prompts) == 1:
            raise ModelError("the model could not run this prompt (injected failure)")
        return self.inner.stream_chat(messages, options, cancel)


def with_lm(engines: Engines, lm: ChatModel) -> Engines:
    return Engines(asr=engines.asr, tts=engines.tts, lm=lm, load_seconds={})


def synthesise(engines: Engines, text: str, path: Path) -> Path:
    write_wav(path, list(engines.tts.synthesize(text)), engines.tts.sample_rate)
    return path


async def collect(session: Session, into: list[Event]) -> None:
    async for event in session.events():
        into.append(event)


async def wait_for(events: list[Event], predicate: Callable[[Event], bool]) -> Event:
    async with asyncio.timeout(120):
        while True:
            for event in events:
                if predicate(event):
                    return event
            await asyncio.sleep(0.02)


def test_two_turn_conversation_from_files_carries_the_history(engines: Engines, tmp_path: Path) -> None:
    first = synthesise(engines, "My name is Alice.", tmp_path / "one.wav")
    second = synthesise(engines, "What is my name?", tmp_path / "two.wav")
    lm = RecordingModel(engines.lm)
    config = SessionConfig(generation=spoken_answer(max_new_tokens=32),
                           turn_taking=TurnTakingConfig(early_answer=False))
    result = asyncio.run(run_files(with_lm(engines, lm), [first, second], config))

    assert [len(turn.errors) for turn in result.turns] == [0, 0]
    assert "alice" in result.turns[0].transcript.lower()
    assert "name" in result.turns[1].transcript.lower()
    assert all(turn.answer for turn in result.turns)
    assert result.audio and sum(len(chunk) for chunk in result.audio) > 0
    # the second answer was asked with the first exchange in its prompt
    second_prompt = lm.prompts[-1]
    roles = [m.role for m in second_prompt if m.role != "system"]
    assert roles == ["user", "assistant", "user"]
    assert any("alice" in m.content.lower() for m in second_prompt if m.role == "user")
    assert any(m.role == "assistant" and m.content == result.turns[0].answer for m in second_prompt)
    for turn in result.turns:
        latency = turn.latency_ms
        assert latency["voice_to_voice"] > 0
        stages = sum(latency[name] for name in latency if not name.startswith("at_") and name not in
                     ("voice_to_voice", "endpoint_delay"))
        assert stages == pytest.approx(latency["voice_to_voice"], abs=0.01)


def test_barge_in_keeps_only_the_phrases_that_were_played(engines: Engines) -> None:
    config = SessionConfig(
        generation=spoken_answer(max_new_tokens=48),
        speculator=SpeculatorConfig(first_phrase_words=3),
        turn_taking=TurnTakingConfig(early_answer=False),
    )

    async def scenario() -> tuple[list[Event], Session, set[asyncio.Task]]:
        session = Session(engines, config)
        await session.start()
        events: list[Event] = []
        collector = asyncio.create_task(collect(session, events))
        await session.send_text("Tell me a long story about the sun, the moon and the stars.")
        await wait_for(events, lambda e: isinstance(e, AudioOut))
        session.report_played(0)  # the speaker has played nothing yet: the turn waits for its audio
        await wait_for(events, lambda e: isinstance(e, PhraseCommitted) and e.phrase_id == 1)
        first_phrase_samples = sum(len(e.pcm) // 2 for e in events if isinstance(e, AudioOut) and e.phrase_id == 0)
        await wait_for(events, lambda e: isinstance(e, AudioOut) and e.phrase_id == 1)
        session.report_played(first_phrase_samples)  # the listener heard exactly the first phrase
        await stream_pcm16(session.feed_audio, speech_pcm16())
        await wait_for(events, lambda e: isinstance(e, TurnEnd) and e.interrupted)
        await session.close()
        await collector
        leftovers = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
        return events, session, leftovers

    events, session, leftovers = asyncio.run(scenario())
    first_phrase = next(e.text for e in events if isinstance(e, PhraseCommitted) and e.phrase_id == 0)
    interrupted = next(e for e in events if isinstance(e, TurnEnd) and e.interrupted)
    clear = next(e for e in events if isinstance(e, Clear))
    assert clear.reason == "barge_in" and clear.turn == interrupted.turn
    assert any(isinstance(e, SpeechStart) and e.turn == interrupted.turn + 1 for e in events)
    assert interrupted.spoken == first_phrase
    assert interrupted.answer != first_phrase  # more had been generated than was heard
    assistant = [m.content for m in session.dialogue.history if m.role == "assistant"]
    assert assistant[0] == first_phrase
    assert not leftovers


def test_cancelling_a_turn_leaves_no_task_and_the_next_turn_works(engines: Engines) -> None:
    async def scenario() -> tuple[list[Event], set[asyncio.Task]]:
        session = Session(engines, SessionConfig(generation=spoken_answer(max_new_tokens=32)))
        await session.start()
        events: list[Event] = []
        collector = asyncio.create_task(collect(session, events))
        await session.send_text("Tell me about the weather.")
        await wait_for(events, lambda e: isinstance(e, LmFirstPass))
        await session.interrupt()
        running = {t for t in asyncio.all_tasks() if t not in (asyncio.current_task(), collector)}
        await session.send_text("Hello, how are you?")
        await wait_for(events, lambda e: isinstance(e, TurnEnd) and e.turn == 2)
        await session.close()
        await collector
        return events, running

    events, running = asyncio.run(scenario())
    assert not running, f"tasks still running after the cancel: {[t.get_name() for t in running]}"
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert [(e.turn, e.interrupted) for e in ends] == [(1, True), (2, False)]
    assert any(isinstance(e, AnswerDone) and e.turn == 2 for e in events)


def test_a_failing_stage_ends_its_turn_with_an_error_and_the_next_turn_works(engines: Engines) -> None:
    lm = FailsOnce(engines.lm)

    async def scenario() -> list[Event]:
        session = Session(with_lm(engines, lm), SessionConfig(generation=spoken_answer(max_new_tokens=16)))
        await session.start()
        events: list[Event] = []
        collector = asyncio.create_task(collect(session, events))
        await session.send_text("First question.")
        await wait_for(events, lambda e: isinstance(e, TurnEnd) and e.turn == 1)
        await session.send_text("Second question.")
        await wait_for(events, lambda e: isinstance(e, TurnEnd) and e.turn == 2)
        await session.close()
        await collector
        return events

    events = asyncio.run(scenario())
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    assert [(e.turn, e.code) for e in errors] == [(1, "model_error")]
    assert "injected failure" in errors[0].message
    assert any(isinstance(e, AnswerDone) and e.turn == 2 for e in events)
    assert any(isinstance(e, AudioOut) and e.turn == 2 for e in events)
