"""Turn-taking with real models on real speech: a pause inside a turn does not split it, and a turn that follows
another keeps its first words."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from scripts.report_lib.speech_samples import LIBRIVOX_DIR
from scripts.report_lib.wer import word_error_rate
from voice.audio import float32_to_pcm16, load_audio_16k
from voice.engines import Engines
from voice.modes.files import run_files, write_wav
from voice.think.spoken import spoken_answer
from voice.turn.session import SessionConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CLIP = "sense_and_sensibility_01_austen_64kb-0{}.wav"
FIRST = ("and mister john dashwood had then leisure to consider how much there might be prudently in his power to do "
         "for them")
SECOND = "he was not an ill disposed young man"
THIRD = "unless to be rather cold hearted and rather selfish is to be ill disposed"
FOURTH = "had he married a more a amiable woman he might have been made still more respectable than he was"


def clip(number: int) -> np.ndarray:
    path = LIBRIVOX_DIR / CLIP.format(number)
    if not path.is_file():
        pytest.skip("pocketsphinx-testdata is not installed")
    return load_audio_16k(path)


def save(path: Path, *parts: np.ndarray) -> Path:
    write_wav(path, [float32_to_pcm16(np.concatenate(parts))], 16000)
    return path


def test_two_clips_joined_by_a_pause_are_one_answered_turn_and_transcripts_stay_with_their_files(
        engines: Engines, tmp_path: Path) -> None:
    pause = np.zeros(int(0.6 * 16000), dtype=np.float32)
    two = save(tmp_path / "two.wav", clip(870), pause, clip(880))
    third = save(tmp_path / "c.wav", clip(890))
    fourth = save(tmp_path / "d.wav", clip(920))
    config = SessionConfig(generation=spoken_answer(max_new_tokens=24))
    result = asyncio.run(run_files(engines, [two, third, fourth], config, realtime=True))

    assert [turn.source for turn in result.turns] == [str(two), str(third), str(fourth)]
    assert all(turn.answer for turn in result.turns), [turn.answer for turn in result.turns]
    assert all(not turn.errors for turn in result.turns)
    references = [f"{FIRST} {SECOND}", THIRD, FOURTH]
    for turn, reference in zip(result.turns, references, strict=True):
        # with its own file: nearer its own reference than any other (tiny.en mishears "ill disposed" itself)
        errors = [word_error_rate([(other, turn.transcript)]) for other in references]
        assert errors[references.index(reference)] == min(errors) < 0.35, turn.transcript
    assert "he was not" in result.turns[0].transcript.lower()  # the half after the pause is in the same turn
    assert result.turns[0].stats["speculations_dropped"] >= 1  # the pause was a speculation, dropped and merged
    assert all(turn.latency_ms["voice_to_voice"] > 0 for turn in result.turns)


def test_a_turn_that_follows_another_keeps_its_first_words(engines: Engines, tmp_path: Path) -> None:
    lead = np.zeros(int(0.3 * 16000), dtype=np.float32)
    first = save(tmp_path / "first.wav", lead, clip(880))
    second = save(tmp_path / "second.wav", lead, clip(890))
    config = SessionConfig(generation=spoken_answer(max_new_tokens=8))
    result = asyncio.run(run_files(engines, [first, second], config, realtime=True))

    words = [turn.transcript.lower().replace("-", " ").split() for turn in result.turns]
    assert words[0][:2] == ["he", "was"], result.turns[0].transcript
    assert words[1][:2] == ["unless", "to"], result.turns[1].transcript
