"""How often the listening stage looks at an open segment: twice as often until its first words (what a barge-in waits
for, each wordless look reported as such), then at the usual step. Real speech through the real VAD; Whisper stood in
for by a model that hears words only once it has heard enough of the segment, as tiny.en on the first syllables of a
voice the echo canceller held down."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from model.fair_lock import FairLock
from voice.audio import load_audio_16k
from voice.events import Event, NoWords, Transcript
from voice.listen.asr_models import LoadedModel
from voice.listen.stage import ListenConfig, ListenStage

CLIP = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav")
R = 16_000
WORDS_FROM_S = 0.9  # the stand-in hears words once a decode covers this much of the segment


class LateWhisper:
    """Records how much audio each decode saw; hears " yes" only in a buffer of `WORDS_FROM_S` or more."""

    def __init__(self) -> None:
        self.decoded: list[int] = []

    def transcribe(self, audio: np.ndarray, **_: object) -> tuple[list[SimpleNamespace], None]:
        self.decoded.append(len(audio))
        if len(audio) < WORDS_FROM_S * R:
            return [], None
        end = len(audio) / R
        word = SimpleNamespace(word=" yes", start=end - 0.3, end=end - 0.1)
        return [SimpleNamespace(words=[word], text=" yes", start=end - 0.3, end=end - 0.1)], None


def test_partials_come_twice_as_often_until_the_segments_first_words() -> None:
    if not CLIP.is_file():
        pytest.skip("pocketsphinx-testdata is not installed")
    speech = load_audio_16k(CLIP)
    whisper = LateWhisper()
    partials: list[str] = []
    unheard: list[float] = []  # where each decode that heard no words reached, on the stream's clock

    async def emit(event: Event) -> None:
        if isinstance(event, Transcript) and not event.final:
            partials.append(event.text)
        elif isinstance(event, NoWords):
            assert not partials, "a decode without words after the first words"
            unheard.append(event.through_ms)

    async def listen() -> None:
        stage = ListenStage("s", emit, ListenConfig(), model=LoadedModel("late", whisper, FairLock()))
        pcm = (np.concatenate([np.zeros(R // 2, np.float32), speech]) * 32767).astype("<i2").tobytes()
        for at in range(0, len(pcm), 1024):  # 32 ms chunks, each decode done before the next (a fast CPU)
            await stage.accept(pcm[at : at + 1024])
            await stage.wait_for_decodes()
        await stage.aclose()

    asyncio.run(listen())
    assert partials and partials[0] == "yes"
    steps = np.diff(whisper.decoded) / R
    first_words = next(i for i, n in enumerate(whisper.decoded) if n >= WORDS_FROM_S * R)
    before, after = steps[:first_words], steps[first_words : first_words + 4]
    assert len(before) >= 2 and before.max() < 0.2  # every ~0.125 s (+ a chunk) while no word has come
    assert np.median(after) >= 0.25  # then the usual step (a pause in the speech brings its likely final sooner)
    # each look that heard nothing says how far it heard (what a paused answer's resume is judged on)
    assert len(unheard) == first_words and np.allclose(np.diff(unheard), 1000 * steps[: first_words - 1])
