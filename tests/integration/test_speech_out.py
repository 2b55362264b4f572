"""Piper TTS and the speaking stage with the real bundled voice (en_US-joe-medium, 22,050 Hz)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from model.chat import Draft, DraftPiece
from voice.errors import TTSError
from voice.events import (
    AudioEnd,
    AudioOut,
    AudioStart,
    Event,
    PhraseCommitted,
    SpeculationResult,
    TtsFirstChunk,
)
from voice.speak.speculator import SpeculatorConfig
from voice.speak.stage import SpeakReport, SpeakStage
from voice.speak.tts import PiperSynthesizer, TTSConfig, load_synthesizer

pytestmark = pytest.mark.slow

FIRST = ["Hello", " there", ",", " my", " friend", "."]
SECOND = [" How", " are", " you", "?"]
OTHER_SECOND = [" Nice", " to", " meet", " you", "!", " Bye"]  # " Bye" closes the phrase before it


@pytest.fixture(scope="module")
def synthesizer() -> PiperSynthesizer:
    return load_synthesizer(TTSConfig())


def draft(step: int, committed: list[str], guess: list[str], done: bool = False) -> Draft:
    pieces = [DraftPiece(t, True) for t in committed] + [DraftPiece(t, False, 0.9) for t in guess]
    return Draft(step=step, pieces=tuple(pieces), done=done, finish_reason="stop" if done else None)


async def paced(drafts: list[Draft], queue: asyncio.Queue[Draft | None], pass_s: float = 0.12) -> None:
    """Drafts onto the stage's queue at the pace of refinement passes, so speculative renders have time to run
    between them; `None` at the end, as the session's LM pump does."""
    for item in drafts:
        await asyncio.sleep(pass_s)
        await queue.put(item)
    await queue.put(None)


async def speak(
    synthesizer: PiperSynthesizer, drafts: list[Draft], config: SpeculatorConfig, pass_s: float = 0.12
) -> tuple[list[Event], SpeakReport]:
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    stage = SpeakStage(synthesizer, emit, session="s", turn=1, config=config)
    queue: asyncio.Queue[Draft | None] = asyncio.Queue()
    async with asyncio.TaskGroup() as group:
        group.create_task(paced(drafts, queue, pass_s), name="drafts")
        report = await stage.run(queue)
    return events, report


def assert_audio_only_after_commit(events: list[Event]) -> None:
    committed: set[int] = set()
    last_phrase = -1
    for event in events:
        if isinstance(event, PhraseCommitted):
            committed.add(event.phrase_id)
        elif isinstance(event, AudioOut):
            assert event.phrase_id in committed, "audio released for an uncommitted phrase"
            assert event.phrase_id >= last_phrase, "audio out of phrase order"
            last_phrase = event.phrase_id


def test_short_phrase_gives_pcm16_at_the_voice_rate(synthesizer: PiperSynthesizer) -> None:
    chunks = list(synthesizer.synthesize("Hello, how are you?"))
    pcm = b"".join(chunks)
    assert synthesizer.sample_rate == 22050
    assert chunks and all(len(chunk) % 2 == 0 for chunk in chunks)
    samples = np.frombuffer(pcm, dtype="<i2")
    assert 0.4 * 22050 < len(samples) < 4 * 22050  # about a second of speech
    assert np.abs(samples).max() > 3000  # speech, not silence
    assert list(synthesizer.synthesize("🎉 **")) == []  # nothing speakable: no audio


def test_a_lead_synthesis_runs_on_its_own_threads_and_speaks_the_same_length(synthesizer: PiperSynthesizer) -> None:
    """`lead` (a first phrase while the LM stands aside) uses the voice's second session on `lead_threads`: the same
    voice, so the same amount of speech (Piper's noise makes the samples differ from run to run)."""
    config = synthesizer.config
    assert config.lead_threads == 2 != config.threads
    sessions = {lead: (synthesizer._lead_voice if lead else synthesizer._voice).session for lead in (False, True)}
    assert sessions[True] is not sessions[False]
    assert sessions[True].get_session_options().intra_op_num_threads == 2
    lengths = [sum(len(c) for c in synthesizer.synthesize("Hello, how are you?", lead=lead)) for lead in (False, True)]
    assert abs(lengths[1] - lengths[0]) < 0.25 * lengths[0]
    same = PiperSynthesizer.load(TTSConfig(lead_threads=config.threads))  # nothing to gain: no second session
    assert same._lead_voice is same._voice


def test_synthesis_stops_between_chunks_when_cancelled(synthesizer: PiperSynthesizer) -> None:
    import threading

    cancel = threading.Event()
    chunks = synthesizer.synthesize("First sentence here. Second sentence here. Third one.", cancel)
    first = next(chunks)
    cancel.set()
    rest = list(chunks)  # at most the slices of the sentence already synthesised
    total = sum(len(c) for c in [first, *rest])
    full = sum(len(c) for c in synthesizer.synthesize("First sentence here. Second sentence here. Third one."))
    assert total < full / 2


def test_missing_or_corrupt_voice_raises_tts_error(tmp_path: Path) -> None:
    with pytest.raises(TTSError, match="not found"):
        PiperSynthesizer.load(TTSConfig(voice=tmp_path / "nope.onnx"))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    (tmp_path / "bad.onnx.json").write_text("{}")
    with pytest.raises(TTSError, match="not a valid voice config"):
        PiperSynthesizer.load(TTSConfig(voice=bad))
    from voice.speak.tts import default_voice_paths

    (tmp_path / "bad.onnx.json").write_text(default_voice_paths()[1].read_text())
    with pytest.raises(TTSError, match="corrupt"):
        PiperSynthesizer.load(TTSConfig(voice=bad))


def test_stable_draft_is_a_hit_and_changed_draft_is_a_miss(synthesizer: PiperSynthesizer) -> None:
    answer = FIRST + SECOND
    drafts = [
        draft(0, [], FIRST + OTHER_SECOND),
        draft(1, [], FIRST + OTHER_SECOND),  # both phrases stable: both rendered speculatively
        draft(2, FIRST[:3], FIRST[3:] + OTHER_SECOND),
        draft(3, answer[:7], answer[7:]),  # phrase 0 committed; phrase 1 changed: its render is discarded
        draft(4, answer, [], done=True),
    ]
    events, report = asyncio.run(speak(synthesizer, drafts, SpeculatorConfig(stable_passes=2)))
    assert_audio_only_after_commit(events)
    outcomes = {e.phrase_id: e.outcome for e in events if isinstance(e, SpeculationResult)}
    assert outcomes == {0: "hit", 1: "miss"}
    assert [e.text for e in events if isinstance(e, PhraseCommitted)] == ["Hello there, my friend.", "How are you?"]
    kinds = [type(e) for e in events if isinstance(e, TtsFirstChunk | AudioStart | AudioOut | AudioEnd)]
    assert kinds[:2] == [TtsFirstChunk, AudioStart] and kinds[-1] is AudioEnd
    # (Whether the wrong render of phrase 1 had started, and so wasted CPU, depends on the load: not asserted.)
    assert report.hits == 1 and report.misses == 1 and report.nones == 0
    hit = next(e for e in events if isinstance(e, SpeculationResult) and e.phrase_id == 0)
    assert hit.saved_ms > 0
    assert report.samples_out == sum(len(e.pcm) // 2 for e in events if isinstance(e, AudioOut))


def test_no_audio_before_commit_even_when_the_render_is_ready(synthesizer: PiperSynthesizer) -> None:
    drafts = [draft(0, [], FIRST + SECOND), draft(1, [], FIRST + SECOND), draft(2, [], FIRST + SECOND),
              draft(3, FIRST + SECOND, [], done=True)]  # fmt: skip
    events, _ = asyncio.run(speak(synthesizer, drafts, SpeculatorConfig(stable_passes=1)))
    first_commit = next(i for i, e in enumerate(events) if isinstance(e, PhraseCommitted))
    first_audio = next(i for i, e in enumerate(events) if isinstance(e, AudioOut))
    assert first_commit < first_audio
    assert_audio_only_after_commit(events)


def test_speculation_off_renders_only_on_commit(synthesizer: PiperSynthesizer) -> None:
    answer = FIRST + SECOND
    drafts = [draft(0, [], answer), draft(1, [], answer), draft(2, answer[:7], answer[7:]), draft(3, answer, [], True)]
    events, report = asyncio.run(speak(synthesizer, drafts, SpeculatorConfig(enabled=False)))
    assert {e.outcome for e in events if isinstance(e, SpeculationResult)} == {"none"}
    assert report.wasted_ms == 0 and report.phrases == ("Hello there, my friend.", "How are you?")
    assert_audio_only_after_commit(events)


def test_cancelling_the_stage_leaves_no_task_behind(synthesizer: PiperSynthesizer) -> None:
    async def scenario() -> list[Event]:
        events: list[Event] = []
        first_audio = asyncio.Event()

        async def emit(event: Event) -> None:
            events.append(event)
            if isinstance(event, AudioOut):
                first_audio.set()

        queue: asyncio.Queue[Draft | None] = asyncio.Queue()
        stage = SpeakStage(synthesizer, emit, session="s", turn=2, config=SpeculatorConfig(stable_passes=1))
        task = asyncio.create_task(stage.run(queue), name="speak")
        long_answer = [*FIRST, " This", " is", " a", " much", " longer", " second", " sentence", " to", " say", "."]
        await queue.put(draft(0, [*FIRST, " This"], long_answer[7:]))
        await asyncio.wait_for(first_audio.wait(), timeout=20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []
        count = len(events)
        await asyncio.sleep(0.3)
        assert len(events) == count  # nothing is emitted after the cancel
        return events

    events = asyncio.run(scenario())
    assert not any(isinstance(e, AudioEnd) for e in events)
    assert_audio_only_after_commit(events)
