"""The session shell with fake stages (no models): it executes what the turn-taking core decides, and the review
findings of issue 16 stay fixed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import voice.turn.session as session_module
from model.chat import ChatMessage, Draft, DraftPiece, GenerationOptions
from model.spare_cores import SpareCores
from voice.engines import Engines
from voice.events import (
    AudioOut,
    Clear,
    Event,
    Pause,
    Resume,
    SpeechEnd,
    SpeechStart,
    Transcript,
    TurnEnd,
    VoiceResumed,
    now_ns,
)
from voice.think.lm_run import LmRun
from voice.think.spoken import spoken_answer
from voice.turn.detector_runs import DetectorRuns
from voice.turn.detector_schedule import DetectorAnswered
from voice.turn.machine_events import State
from voice.turn.session import Session, SessionConfig

WORDS = ("Sure.", "Here", "is", "a", "fairly", "long", "answer,", "with", "several", "phrases,", "so", "that", "speech",
         "goes", "on", "for", "a", "while.")


class FakeLM:
    """Commits one word per pass, `pass_s` apart; counts answers running at once. Its first pass reports
    `end_of_turn` as the LM's end-of-turn probability (None: it has none, as a remote model)."""

    name = "fake"

    def __init__(self, pass_s: float = 0.005, end_of_turn: float | None = None) -> None:
        self.pass_s = pass_s
        self.end_of_turn = end_of_turn
        self.running = 0
        self.most_at_once = 0
        self.prompts: list[list[ChatMessage]] = []
        self._lock = threading.Lock()

    def stream_chat(self, messages: Sequence[ChatMessage], options: GenerationOptions,
                    cancel: threading.Event | None = None) -> Iterator[Draft]:
        self.prompts.append(list(messages))
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            for step in range(len(WORDS)):
                if cancel is not None and cancel.is_set():
                    return
                time.sleep(self.pass_s)
                pieces = tuple(DraftPiece(" " + word, True) for word in WORDS[:step + 1])
                done = step == len(WORDS) - 1
                yield Draft(step, pieces, done=done, finish_reason="stop" if done else None,
                            completion_tokens=step + 1, end_of_turn=self.end_of_turn if step == 0 else None)
        finally:
            with self._lock:
                self.running -= 1


class FakeTTS:
    sample_rate = 16000

    def synthesize(self, text: str, cancel: threading.Event | None = None, lead: bool = False) -> Iterator[bytes]:
        for _ in text.split():
            if cancel is not None and cancel.is_set():
                return
            time.sleep(0.002)
            yield b"\x01\x00" * 800


class FakeListen:
    """Stands in for ListenStage: counts overlapping calls; events are pushed by the test through `emit`."""

    instances: ClassVar[list[FakeListen]] = []

    def __init__(self, session: str, emit, config=None, model=None, on_likely_final=None) -> None:
        self.emit = emit
        self.on_likely_final = on_likely_final
        self.config = config
        self.inside = 0
        self.overlaps = 0
        self.accepted = 0  # chunks of audio the session let through
        self.silence_ms = 0.0
        self.speech_start_ms = self.speech_end_ms = 0.0
        self.last_segment_audio = np.zeros(16000, dtype=np.float32)
        self.open_segment: str | None = None  # words of a segment still open: `flush` ends it with them
        FakeListen.instances.append(self)

    def retune(self, config) -> None:
        self.config = config

    async def _enter(self) -> None:
        self.inside += 1
        self.overlaps += self.inside > 1
        await asyncio.sleep(0.002)  # a VAD window in a thread
        self.inside -= 1

    async def accept(self, pcm: bytes, sample_rate: int = 16000) -> None:
        self.accepted += 1
        await self._enter()

    async def flush(self) -> None:
        await self._enter()
        if self.open_segment is not None:
            text, self.open_segment = self.open_segment, None
            await self.emit(SpeechEnd(session="s", turn=0, t_ns=now_ns(), detected_ns=now_ns()))
            await self.emit(Transcript(session="s", turn=0, text=text, committed=text, final=True))

    async def aclose(self) -> None:
        pass


class FakeDetector:
    """Smart Turn's interface with a fixed opinion; remembers how much audio it was shown."""

    def __init__(self, complete: bool) -> None:
        self.complete = complete
        self.config = type("Config", (), {"max_seconds": 8.0, "threshold": 0.5, "threads": 1})()
        self.heard_s: list[float] = []

    def is_complete(self, audio: np.ndarray) -> bool:
        self.heard_s.append(audio.size / 16000)
        return self.complete

    def probability(self, audio: np.ndarray) -> float:
        return 1.0 if self.is_complete(audio) else 0.0


@pytest.fixture
def make_session(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(session_module, "ListenStage", FakeListen)
    FakeListen.instances.clear()

    def make(lm: FakeLM | None = None, detector: FakeDetector | None = None, **config) -> Session:
        engines = Engines(asr=None, tts=FakeTTS(), lm=lm or FakeLM(), load_seconds={},  # type: ignore[arg-type]
                          turn_detector=detector)  # type: ignore[arg-type]
        config.setdefault("wait_for_playback", False)
        return Session(engines, SessionConfig(generation=spoken_answer(max_new_tokens=32), **config))

    return make


async def started(session: Session) -> tuple[FakeListen, list[Event], asyncio.Task]:
    await session.start()
    events: list[Event] = []

    async def collect() -> None:
        async for event in session.events():
            events.append(event)

    return FakeListen.instances[-1], events, asyncio.create_task(collect())


async def say(listen: FakeListen, text: str, start_ns: int | None = None) -> None:
    start = now_ns() if start_ns is None else start_ns
    await listen.emit(SpeechStart(session="s", turn=0, t_ns=start))
    await listen.emit(SpeechEnd(session="s", turn=0, t_ns=start + 1_000_000, detected_ns=now_ns()))
    await listen.emit(Transcript(session="s", turn=0, text=text, committed=text, final=True))


async def until(predicate, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.005)


def test_the_utterance_watchdog_never_calls_into_the_listener_while_audio_is_fed(make_session) -> None:
    """Review finding: web/server.py's watchdog called `end_of_audio` while intake was inside `accept`."""

    async def scenario() -> int:
        session = make_session()
        listen, _, collector = await started(session)

        async def intake() -> None:
            for _ in range(50):
                await session.feed_audio(b"\x00\x00" * 320)

        async def watchdog() -> None:
            for _ in range(20):
                await session.end_of_audio()

        await asyncio.gather(intake(), watchdog())
        await session.close()
        await collector
        return listen.overlaps

    assert asyncio.run(scenario()) == 0


def test_a_spoken_final_while_a_typed_answer_runs_never_starts_a_second_answer(make_session) -> None:
    async def scenario() -> tuple[FakeLM, list[Event]]:
        lm = FakeLM(pass_s=0.02)
        session = make_session(lm)
        listen, events, collector = await started(session)
        await listen.emit(SpeechStart(session="s", turn=0, t_ns=now_ns()))
        await session.send_text("typed question")
        await listen.emit(SpeechEnd(session="s", turn=0, t_ns=now_ns(), detected_ns=now_ns()))
        await listen.emit(Transcript(session="s", turn=0, text="spoken words", committed="", final=True))
        await session.user_done()
        await asyncio.wait_for(session.wait_idle(), 10)
        await session.close()
        await collector
        return lm, events

    lm, events = asyncio.run(scenario())
    assert lm.most_at_once == 1 and len(lm.prompts) == 1
    assert [e.user_text for e in events if isinstance(e, TurnEnd)] == ["typed question"]


def test_a_speculative_answer_is_silent_until_the_end_of_turn_is_confirmed(make_session) -> None:
    async def scenario() -> tuple[list[Event], int, Session]:
        session = make_session()
        listen, events, collector = await started(session)
        await say(listen, "What time is it?")
        assert session.core.state is State.USER_PAUSED
        await asyncio.sleep(0.5)  # long enough for the fake model and voice to finish the whole answer
        audio_while_held = sum(isinstance(e, AudioOut) for e in events)
        listen.silence_ms = 700.0
        await session.feed_audio(b"\x00\x00" * 320)  # the silence rule confirms the end of turn
        await asyncio.wait_for(session.wait_idle(), 10)
        await session.close()
        await collector
        return events, audio_while_held, session

    events, audio_while_held, session = asyncio.run(scenario())
    assert audio_while_held == 0
    end = next(e for e in events if isinstance(e, TurnEnd))
    assert end.answer and not end.interrupted and end.stats["early_lm"] == 1.0
    assert any(isinstance(e, AudioOut) for e in events)
    assert [m.role for m in session.dialogue.history] == ["user", "assistant"]


@pytest.mark.parametrize("end_of_turn", [0.75, None])
def test_the_turn_record_keeps_the_lms_end_of_turn_probability(make_session, end_of_turn: float | None) -> None:
    async def scenario() -> TurnEnd:
        session = make_session(FakeLM(end_of_turn=end_of_turn))
        _, events, collector = await started(session)
        await session.send_text("What time is it?")
        await asyncio.wait_for(session.wait_idle(), 10)
        await session.close()
        await collector
        return next(e for e in events if isinstance(e, TurnEnd))

    end = asyncio.run(scenario())
    assert end.answer
    assert end.stats.get("lm_end_of_turn") == end_of_turn  # absent, never guessed, when the model gives none


def test_speech_in_the_pause_drops_the_held_answer_and_the_turn_continues_with_one_answer(make_session) -> None:
    async def scenario() -> tuple[list[Event], FakeLM]:
        lm = FakeLM()
        session = make_session(lm)
        listen, events, collector = await started(session)
        await say(listen, "Tell me about")
        await asyncio.sleep(0.05)
        await say(listen, "the weather.")
        await session.user_done()
        await asyncio.wait_for(session.wait_idle(), 10)
        await session.close()
        await collector
        return events, lm

    events, lm = asyncio.run(scenario())
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert [(e.turn, e.user_text) for e in ends] == [(1, "Tell me about the weather.")]
    assert ends[0].stats["speculations"] == 2 and ends[0].stats["speculations_dropped"] == 1
    assert {e.turn for e in events if isinstance(e, AudioOut)} == {1}
    assert lm.prompts[-1][-1].content == "Tell me about the weather."


def test_no_audio_follows_a_clear(make_session) -> None:
    """Review finding: one AudioOut could follow Clear (the browser played ~200 ms of the cancelled answer)."""

    async def scenario() -> list[Event]:
        session = make_session(FakeLM(pass_s=0.01))
        _, events, collector = await started(session)
        for attempt in range(5):
            await session.send_text(f"question {attempt}")
            await until(lambda turn=attempt + 1: any(isinstance(e, AudioOut) and e.turn == turn for e in events))
            await asyncio.sleep(0.003 * attempt)
            await session.interrupt()
        await session.close()
        await collector
        return events

    events = asyncio.run(scenario())
    clears = [i for i, e in enumerate(events) if isinstance(e, Clear)]
    assert len(clears) == 5
    for index in clears:
        turn = events[index].turn
        assert not [e for e in events[index:] if isinstance(e, AudioOut) and e.turn == turn]


def test_a_cough_during_playback_does_not_drop_the_answer(make_session) -> None:
    async def scenario() -> list[Event]:
        session = make_session(FakeLM(pass_s=0.01))
        listen, events, collector = await started(session)
        await session.send_text("Tell me a story.")
        await until(lambda: any(isinstance(e, AudioOut) for e in events))
        await say(listen, "")  # speech without words: a cough, or the assistant's own echo
        await asyncio.wait_for(session.wait_idle(), 10)
        await session.close()
        await collector
        return events

    events = asyncio.run(scenario())
    assert not any(isinstance(e, Clear) for e in events)
    assert [type(e) for e in events if isinstance(e, Pause | Resume)] == [Pause, Resume]
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert len(ends) == 1 and not ends[0].interrupted and ends[0].answer == " ".join(WORDS)


def test_a_long_wordless_noise_during_playback_pauses_the_answer_then_lets_it_play_on(make_session) -> None:
    """The sound never ends and never becomes words: the clock resumes the answer, which plays to its end."""

    async def scenario() -> list[Event]:
        session = make_session(FakeLM(pass_s=0.01), wait_for_playback=True)
        listen, events, collector = await started(session)
        await session.send_text("Tell me a story.")
        await until(lambda: any(isinstance(e, AudioOut) for e in events))
        await listen.emit(SpeechStart(session="s", turn=0, t_ns=now_ns()))  # a noise that goes on
        await until(lambda: any(isinstance(e, TurnEnd) for e in events), timeout_s=20)
        await session.close()
        await collector
        return events

    events = asyncio.run(scenario())
    kinds = [type(e) for e in events if isinstance(e, Pause | Resume | TurnEnd | Clear)]
    assert kinds == [Pause, Resume, TurnEnd]
    end = next(e for e in events if isinstance(e, TurnEnd))
    assert not end.interrupted and end.spoken == " ".join(WORDS)


def test_a_client_that_stops_sending_audio_mid_speech_still_gets_its_answer(make_session) -> None:
    """No audio after the words: no trailing silence reaches the endpointer, yet the turn ends and is answered."""

    async def scenario() -> list[Event]:
        session = make_session()
        listen, events, collector = await started(session)
        await listen.emit(SpeechStart(session="s", turn=0, t_ns=now_ns()))
        listen.open_segment = "What time is it?"
        for _ in range(5):
            await session.feed_audio(b"\x00\x00" * 320)
        await until(lambda: any(isinstance(e, TurnEnd) for e in events), timeout_s=20)  # and then nothing
        await session.close()
        await collector
        return events

    events = asyncio.run(scenario())
    end = next(e for e in events if isinstance(e, TurnEnd))
    assert end.user_text == "What time is it?" and end.answer == " ".join(WORDS) and not end.interrupted


def test_lm_run_close_never_swallows_the_callers_cancellation() -> None:
    """Review finding: `LmRun.close` suppressed CancelledError, so a cancelled caller went on as if nothing happened."""

    async def scenario() -> tuple[bool, list[str]]:
        run = LmRun(FakeLM(pass_s=0.2), [ChatMessage("user", "hi")], GenerationOptions(), name="lm-test")
        after: list[str] = []

        async def caller() -> None:
            await run.close()
            after.append("went on after close")

        task = asyncio.create_task(caller())
        await asyncio.sleep(0.01)  # inside close, waiting for the thread's pass to end
        task.cancel()
        await asyncio.wait({task})
        await run.close()
        return task.cancelled(), after

    cancelled, after = asyncio.run(scenario())
    assert cancelled and after == []


@pytest.mark.parametrize("complete", [True, False])
def test_the_turn_detector_releases_a_complete_turn_early_and_holds_an_incomplete_one(make_session, complete) -> None:
    async def scenario() -> tuple[list[Event], FakeDetector]:
        detector = FakeDetector(complete)
        session = make_session(detector=detector)
        listen, events, collector = await started(session)
        await say(listen, "Is it raining")
        listen.silence_ms = 350.0  # past the detector's 200 ms, well short of the 600 ms silence rule
        await until(lambda: detector.heard_s)
        await asyncio.sleep(0.3)
        await session.feed_audio(b"\x00\x00" * 320)
        await asyncio.sleep(0.3)
        await session.close()
        await collector
        return events, detector

    events, detector = asyncio.run(scenario())
    assert detector.heard_s == [1.0]
    assert any(isinstance(e, AudioOut) for e in events) is complete


def test_the_played_report_of_the_turn_decides_what_the_history_keeps(make_session) -> None:
    async def scenario() -> tuple[TurnEnd, Session]:
        session = make_session(FakeLM(pass_s=0.01))
        _, events, collector = await started(session)
        await session.send_text("Tell me a story.")
        await until(lambda: any(isinstance(e, AudioOut) for e in events))
        session.report_played(10**9, turn=99)  # a stale report about another turn changes nothing
        session.report_played(0, turn=1)  # the browser has played nothing of turn 1 yet
        await session.interrupt()
        await session.close()
        await collector
        return next(e for e in events if isinstance(e, TurnEnd)), session

    end, session = asyncio.run(scenario())
    assert end.interrupted and end.spoken == ""
    assert not [m for m in session.dialogue.history if m.role == "assistant" and m.content]


class PreparingLM(FakeLM):
    """A FakeLM that, like the bundled model, can encode the next prompt's known part ahead."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared: list[tuple[list[ChatMessage], threading.Event | None]] = []
        self.words: list[str] = []  # the user's words each prepare was given
        self.conversations: list[str | None] = []  # of every prepare and answer, in order

    def prepare(self, messages: Sequence[ChatMessage], cancel: threading.Event | None = None,
                conversation: str | None = None, system_prompt: str | None = None, words: str = "") -> list[int]:
        self.prepared.append((list(messages), cancel))
        self.words.append(words)
        self.conversations.append(conversation)
        return []

    def stream_chat(self, messages: Sequence[ChatMessage], options: GenerationOptions,
                    cancel: threading.Event | None = None) -> Iterator[Draft]:
        self.conversations.append(options.conversation)
        return super().stream_chat(messages, options, cancel)


def test_the_next_prompt_is_prepared_at_the_start_and_after_every_turn(make_session) -> None:
    async def scenario() -> tuple[PreparingLM, str]:
        lm = PreparingLM()
        session = make_session(lm)
        listen, events, collector = await started(session)
        assert len(lm.prepared) == 1 and lm.prepared[0][0] == []  # the system prompt and the user header
        await say(listen, "What is the capital of France?")
        listen.silence_ms = 700.0
        await session.feed_audio(b"\x00\x00" * 320)
        await until(lambda: any(isinstance(e, TurnEnd) for e in events))
        await session.close()
        await collector
        return lm, session.id

    lm, session_id = asyncio.run(scenario())
    assert lm.conversations == [session_id] * 3  # prepare, answer, prepare: all in the session's own cache slot
    assert len(lm.prepared) == 2
    first_cancel = lm.prepared[0][1]
    assert first_cancel is not None and first_cancel.is_set()  # the answer came: a prepare still waiting is moot
    messages, _ = lm.prepared[1]
    assert [m.role for m in messages] == ["user", "assistant"]  # what the next answer sees before the new words
    assert messages[0].content == "What is the capital of France?"
    assert messages[1].content == " ".join(WORDS)
    assert lm.prompts[0][-1].content == "What is the capital of France?"


def test_the_words_committed_while_the_user_speaks_are_prepared_ahead_of_the_answer(make_session) -> None:
    """Each partial whose committed words grew has the LM encode them (the next message starts with them), with the
    turn's earlier segments before them; nothing while an answer to the turn is in flight."""
    async def scenario() -> PreparingLM:
        lm = PreparingLM()
        session = make_session(lm, detector=FakeDetector(complete=True))
        listen, _events, collector = await started(session)
        await listen.emit(SpeechStart(session="s", turn=0, t_ns=now_ns()))
        for committed in ("", "Remind me", "Remind me", "Remind me to call"):
            await listen.emit(Transcript(session="s", turn=0, text=f"{committed} Sam", committed=committed,
                                         final=False))
        await listen.emit(Transcript(session="s", turn=0, text="Remind me to call Sam", committed="Remind me to call",
                                     final=False, likely_final=True))
        await until(lambda: len(lm.prompts) == 1)  # the early answer: in flight, so nothing more is prepared
        await listen.emit(Transcript(session="s", turn=0, text="Remind me to call Sam at", committed="Remind me to "
                                     "call Sam", final=False))
        await session.close()
        await collector
        return lm

    lm = asyncio.run(scenario())
    assert lm.words == ["", "Remind me", "Remind me to call"]  # the session's start, then each growth once
    assert all(messages == [] for messages, _ in lm.prepared)  # the history before the words: none yet


@pytest.mark.parametrize("spoke_on", [False, True])
def test_the_turn_verdict_is_judged_once_at_the_likely_final(make_session, spoke_on) -> None:
    """The detector judges the segment when its likely final decode starts; the end of the segment reuses that
    verdict when the audio is the same, and asks again when the segment grew after it."""
    async def scenario() -> tuple[list[Event], FakeDetector]:
        detector = FakeDetector(True)
        session = make_session(detector=detector)
        listen, events, collector = await started(session)
        heard = np.linspace(-0.1, 0.1, 16000, dtype=np.float32)
        listen.last_segment_audio = heard
        await listen.emit(SpeechStart(session="s", turn=0, t_ns=now_ns()))
        listen.on_likely_final(heard[:8000] if spoke_on else heard.copy())
        await until(lambda: detector.heard_s)
        await listen.emit(SpeechEnd(session="s", turn=0, t_ns=now_ns(), detected_ns=now_ns()))
        await listen.emit(Transcript(session="s", turn=0, text="Is it raining", committed="Is it raining", final=True))
        listen.silence_ms = 350.0
        await session.feed_audio(b"\x00\x00" * 320)
        await until(lambda: any(isinstance(e, AudioOut) for e in events))
        await session.close()
        await collector
        return events, detector

    _events, detector = asyncio.run(scenario())
    assert detector.heard_s == ([0.5, 1.0] if spoke_on else [1.0])


def test_the_answer_starts_from_the_likely_final_and_a_resumed_voice_drops_it(make_session) -> None:
    spoke = now_ns()

    async def scenario() -> tuple[FakeLM, list[Event], list[TurnEnd]]:
        lm = FakeLM(pass_s=0.01)
        session = make_session(lm, detector=FakeDetector(complete=True))
        listen, events, collector = await started(session)
        await listen.emit(SpeechStart(session="s", turn=0, t_ns=spoke))
        await listen.emit(Transcript(session="s", turn=0, text="I was", committed="", final=False, likely_final=True))
        await until(lambda: len(lm.prompts) == 1)  # started before the segment ended
        await listen.emit(VoiceResumed(session="s", turn=0))  # a short pause: the user goes on
        await until(lambda: lm.running == 0)
        await listen.emit(Transcript(session="s", turn=0, text="I was wondering why", committed="I was", final=False,
                                     likely_final=True))
        await until(lambda: len(lm.prompts) == 2)
        await listen.emit(SpeechEnd(session="s", turn=0, t_ns=spoke + 2_000_000, detected_ns=now_ns()))
        await listen.emit(Transcript(session="s", turn=0, text="I was wondering why", committed="", final=True))
        await session.user_done()
        await asyncio.wait_for(session.wait_idle(), 10)
        await session.close()
        await collector
        return lm, events, [e for e in events if isinstance(e, TurnEnd)]

    lm, events, ends = asyncio.run(scenario())
    assert [m[-1].content for m in lm.prompts] == ["I was", "I was wondering why"]  # no third start at the final
    assert len(ends) == 1 and ends[0].user_text == "I was wondering why" and ends[0].answer
    assert ends[0].stats["speculations_dropped"] == 1
    likely = next(e for e in events if isinstance(e, Transcript) and e.text == "I was wondering why" and not e.final)
    final = next(e for e in events if isinstance(e, Transcript) and e.final)
    # the turn's ASR mark is when the transcript its answer used came (the likely final), not the segment's end
    speech_end = spoke + 2_000_000
    assert ends[0].latency_ms["at_asr_final"] == pytest.approx((likely.t_ns - speech_end) / 1e6)
    assert likely.t_ns < final.t_ns


def test_half_duplex_does_not_feed_the_listener_while_the_answer_plays(make_session) -> None:
    """The shell asks the core whether audio is heard (`accepts_audio`): an open speaker must not barge in."""

    async def scenario() -> tuple[int, int, list[Event]]:
        session = make_session(FakeLM(pass_s=0.01), full_duplex=False, wait_for_playback=True)
        listen, events, collector = await started(session)
        await session.send_text("Tell me a story.")
        await until(lambda: any(isinstance(e, AudioOut) for e in events))
        for _ in range(3):
            await session.feed_audio(b"\x00\x00" * 320)
        while_playing = listen.accepted
        await until(lambda: any(isinstance(e, TurnEnd) for e in events))
        await session.feed_audio(b"\x00\x00" * 320)
        await session.close()
        await collector
        return while_playing, listen.accepted, events

    while_playing, after, events = asyncio.run(scenario())
    assert (while_playing, after) == (0, 1)
    assert not any(isinstance(e, Pause | Clear) for e in events)


class PromptedLM(PreparingLM):
    """Records the system prompt of every prepare and every answer."""

    def __init__(self) -> None:
        super().__init__()
        self.system_prompts: list[tuple[str, str | None]] = []

    def prepare(self, messages: Sequence[ChatMessage], cancel: threading.Event | None = None,
                conversation: str | None = None, system_prompt: str | None = None, words: str = "") -> list[int]:
        self.system_prompts.append(("prepare", system_prompt))
        return super().prepare(messages, cancel, conversation, system_prompt, words)

    def stream_chat(self, messages: Sequence[ChatMessage], options: GenerationOptions,
                    cancel: threading.Event | None = None) -> Iterator[Draft]:
        self.system_prompts.append(("answer", options.system_prompt))
        return super().stream_chat(messages, options, cancel)


def test_instructions_change_the_next_answers_prompt_and_truncate_cuts_the_ended_answer(make_session) -> None:
    async def scenario() -> tuple[PromptedLM, Session, str | None, str]:
        lm = PromptedLM()
        session = make_session(lm)
        _, events, collector = await started(session)
        default = session.instructions
        session.set_instructions("Answer like a pirate.")
        await session.send_text("Hello.")
        await until(lambda: any(isinstance(e, TurnEnd) for e in events))
        cut = session.truncate_heard(1, 0)  # the client played none of it after all
        session.set_instructions(None)
        await session.close()
        await collector
        return lm, session, cut, default

    lm, session, cut, default = asyncio.run(scenario())
    assert ("answer", "Answer like a pirate.") in lm.system_prompts
    assert lm.system_prompts[-1] == ("prepare", default) and session.instructions == default
    assert cut == "" and [m.role for m in session.dialogue.history] == ["user"]
    assert session.truncate_heard(7, 0) is None  # not a turn it knows


def test_a_verdict_hands_its_cores_over_to_the_first_phrase(monkeypatch: pytest.MonkeyPatch) -> None:
    """Smart Turn runs beside the likely final's decode; its call, once ended, must not read to the first phrase's
    render as a load on the cores it would take (model/spare_cores.py), or that render takes one thread beside an
    idle core."""
    gauge = SpareCores(stat=Path("/nonexistent"))  # no sampler thread: only the hand-overs are looked at
    monkeypatch.setattr(SpareCores, "_shared", gauge)
    answered: list[DetectorAnswered] = []

    async def report(answer: DetectorAnswered) -> None:
        answered.append(answer)

    async def run() -> None:
        runs = DetectorRuns(FakeDetector(complete=True), report, "verdicts")  # type: ignore[arg-type]
        before = time.monotonic()
        runs.ask(1, np.zeros(16000, dtype=np.float32))
        runs.await_verdict(1, turn=1)
        await asyncio.gather(*runs.waits())
        assert answered == [DetectorAnswered(1, 1.0)]
        (handover,) = gauge._handovers
        assert before <= handover.start <= handover.end <= time.monotonic() and handover.threads == 1

    asyncio.run(run())
