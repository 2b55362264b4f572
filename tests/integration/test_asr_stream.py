"""Streaming recognition on real recorded speech (LibriVox clips of Debian pocketsphinx-testdata), tiny.en.

Audio is streamed in 30 ms chunks as fast as the stage takes it (no sleeping); the test that checks partials arrive
while the user is still speaking waits for each decode instead of pacing audio in real time, so it holds on any CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
import soundfile
import soxr

from model.fair_lock import FairLock
from scripts.report_lib.speech_samples import librivox_clips
from scripts.report_lib.wer import word_error_rate
from voice.audio import float32_to_pcm16, load_audio_16k, stream_pcm16
from voice.errors import AudioFormatError
from voice.events import Event, SpeechEnd, SpeechStart, Transcript
from voice.listen.asr_models import LoadedModel, load_model
from voice.listen.stage import ListenStage
from voice.listen.transcriber import StreamingTranscriber, TranscriberConfig, transcribe_file
from voice.listen.words import normalize_words

CLIPS = {clip.clip_id[-4:]: clip for clip in librivox_clips()}
STREAMED = ("0880", "0930", "0890")  # 3.0 s, 3.3 s, 5.3 s

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(len(CLIPS) < 5, reason="Debian pocketsphinx-testdata (real speech clips) is not installed"),
]


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return load_model(cpu_threads=2)


def recorder(events: list[Event]) -> Callable[[Event], Awaitable[None]]:
    """An emit callback for a ListenStage that keeps its events in `events`."""

    async def emit(event: Event) -> None:
        events.append(event)

    return emit


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(16000 * seconds), dtype=np.float32)


async def stream(model: LoadedModel, audio: np.ndarray, rate: int = 16000, settle: bool = False) -> list[Event]:
    """Feed `audio` (mono float32 at `rate`) to a fresh ListenStage in 30 ms PCM16 chunks; return its events.

    With `settle`, each chunk waits for the decodes in flight: the partials are those of a real-time stream on a CPU
    fast enough to keep up, and the same on any machine."""
    events: list[Event] = []
    stage = ListenStage("test", recorder(events), model=model)
    pcm = float32_to_pcm16(audio)

    async def send(chunk: bytes) -> None:
        await stage.accept(chunk, rate)
        if settle:
            await stage.wait_for_decodes()

    await stream_pcm16(send, pcm, rate=rate, frame_ms=30)
    await stage.flush()
    return events


@pytest.fixture(scope="module")
def three_turns(model: LoadedModel) -> list[Event]:
    """One stream: three utterances, each followed by a second of silence."""
    parts = [silence(0.5)]
    for clip_id in STREAMED:
        parts += [load_audio_16k(CLIPS[clip_id].path), silence(1.0)]
    return asyncio.run(stream(model, np.concatenate(parts)))


def finals(events: list[Event]) -> list[Transcript]:
    return [e for e in events if isinstance(e, Transcript) and e.final]


def test_exactly_one_end_of_turn_and_one_final_per_utterance(three_turns):
    starts = [e for e in three_turns if isinstance(e, SpeechStart)]
    ends = [e for e in three_turns if isinstance(e, SpeechEnd)]
    assert [e.turn for e in starts] == [e.turn for e in ends] == [e.turn for e in finals(three_turns)] == [1, 2, 3]
    for turn in (1, 2, 3):
        kinds = [e.type for e in three_turns if e.turn == turn and not (isinstance(e, Transcript) and not e.final)]
        assert kinds == ["speech_start", "speech_end", "transcript"]
    for end in ends:
        assert end.t_ns <= end.detected_ns  # last voiced sample arrived before the endpointer could decide


def test_streaming_wer_is_within_one_point_of_offline(three_turns, model):
    references = [CLIPS[clip_id].text for clip_id in STREAMED]
    offline = [transcribe_file(CLIPS[clip_id].path, model.model) for clip_id in STREAMED]
    streamed = [t.text for t in finals(three_turns)]
    offline_wer = word_error_rate(zip(references, offline, strict=True))
    streaming_wer = word_error_rate(zip(references, streamed, strict=True))
    assert streaming_wer <= offline_wer + 0.01, (streamed, offline)
    assert offline_wer < 0.25  # the clips are recognisable at all: guards against feeding garbage to both


def test_partials_come_at_least_every_300_ms_of_audio(model):
    audio = load_audio_16k(CLIPS["0930"].path)
    transcriber = StreamingTranscriber(model.model)
    covered = [0.0]
    partial_texts = []
    for offset in range(0, audio.size, 512):
        transcriber.insert_audio(audio[offset:offset + 512])
        partial = transcriber.process()
        if partial is not None:
            covered.append(partial.audio_s)
            partial_texts.append(partial.text)
            assert partial.text.startswith(partial.committed)
    assert max(np.diff(covered)) <= 0.3
    assert any(normalize_words(text) for text in partial_texts[: len(partial_texts) // 2])  # words before the end
    final = transcriber.finish()
    assert final.final and final.committed == final.text
    assert word_error_rate([(CLIPS["0930"].text, final.text)]) <= 0.15


def test_partials_arrive_while_the_user_is_speaking(model):
    audio = np.concatenate([silence(0.3), load_audio_16k(CLIPS["0880"].path), silence(0.8)])
    events = asyncio.run(stream(model, audio, settle=True))
    kinds = [e.type for e in events]
    start, end = kinds.index("speech_start"), kinds.index("speech_end")
    during = [e for e in events[start:end] if isinstance(e, Transcript) and normalize_words(e.text)]
    assert len(during) >= 3 and not any(e.final for e in during)  # words shown before the user stopped
    assert len(finals(events)) == 1 and kinds.index("transcript", end) > end


def test_no_transcript_from_silence_or_noise(model):
    rng = np.random.default_rng(7)
    white = rng.normal(0.0, 0.05, 16000 * 2).astype(np.float32)
    hum = (0.1 * np.sin(2 * np.pi * 50 * np.arange(16000 * 2) / 16000)).astype(np.float32)
    events = asyncio.run(stream(model, np.concatenate([silence(2.0), white, hum, silence(0.5)])))
    assert events == []


def test_same_transcript_at_any_input_rate_and_channel_count(model, tmp_path):
    clip16k = load_audio_16k(CLIPS["0930"].path)
    expected = normalize_words(transcribe_file(CLIPS["0930"].path, model.model))
    for rate in (8000, 22050, 44100, 48000):
        converted = soxr.resample(clip16k, 16000, rate)
        path = tmp_path / f"clip_{rate}.wav"
        soundfile.write(path, np.stack([converted, converted], axis=1), rate, subtype="PCM_16")  # stereo
        assert normalize_words(transcribe_file(path, model.model)) == expected, rate
    stream44k = soxr.resample(np.concatenate([clip16k, silence(1.0)]), 16000, 44100)
    streamed = finals(asyncio.run(stream(model, stream44k, rate=44100)))
    assert len(streamed) == 1 and normalize_words(streamed[0].text) == expected


def test_bad_input_raises_clear_errors_and_the_stream_goes_on(model, tmp_path):
    async def scenario() -> list[Event]:
        events: list[Event] = []
        stage = ListenStage("bad", recorder(events), model=model)
        with pytest.raises(AudioFormatError, match="odd number of bytes"):
            await stage.accept(b"\x00\x01\x02", 16000)
        with pytest.raises(AudioFormatError, match="sample rate"):
            await stage.accept(b"\x00\x00" * 160, 1000)
        pcm = float32_to_pcm16(np.concatenate([load_audio_16k(CLIPS["0880"].path), silence(1.0)]))
        await stream_pcm16(stage.accept, pcm, frame_ms=30)
        return events

    assert len(finals(asyncio.run(scenario()))) == 1  # the session survived the bad chunks
    for content, message in [(b"", "empty"), (b"RIFF\x24\x00\x00\x00WAVEfmt ", "not a readable"),
                             (b"hello, I am plain text and not audio at all" * 20, "not a readable")]:
        path = tmp_path / "bad.wav"
        path.write_bytes(content)
        with pytest.raises(AudioFormatError, match=message):
            transcribe_file(path, model.model)
    transcriber = StreamingTranscriber(model.model)
    with pytest.raises(AudioFormatError, match="mono"):
        transcriber.insert_audio(np.zeros((320, 2), dtype=np.float32))
    with pytest.raises(AudioFormatError, match="float32"):
        transcriber.insert_audio(np.zeros(320, dtype=np.float64))


def test_long_turn_is_trimmed_at_committed_segments_and_stays_accurate(model):
    """All five clips with 150 ms pauses: one 26 s turn, longer than the trimming threshold."""
    gap = silence(0.15)
    audio = np.concatenate([part for clip in CLIPS.values() for part in (load_audio_16k(clip.path), gap)])
    # short trimming thresholds so that cuts happen often, including right after the last decode
    transcriber = StreamingTranscriber(model.model, TranscriberConfig(trim_after_s=4.0, force_trim_after_s=8.0))
    buffer_lengths = []
    for offset in range(0, audio.size, 32000):  # 2 s steps: what a slow CPU's coalesced decodes look like
        chunk = audio[offset:offset + 32000]
        transcriber.insert_audio(chunk)
        last = offset + 32000 >= audio.size
        assert transcriber.process(as_final=last) is not None  # the last one as the stage does in trailing silence
        buffer_lengths.append(transcriber.buffer_s)
    assert max(buffer_lengths) < 15 < audio.size / 16000  # the buffer was cut, never grew to the whole turn
    # the likely final (the last decode, reused by finish) cuts nothing: its words are timed only roughly
    assert buffer_lengths[-1] == pytest.approx(buffer_lengths[-2] + chunk.size / 16000)
    decodes = transcriber.decodes
    final = transcriber.finish()
    assert transcriber.decodes == decodes  # finish reused the last decode
    reference = " ".join(clip.text for clip in CLIPS.values())
    assert word_error_rate([(reference, final.text)]) <= 0.15, final.text  # no words lost or doubled at the cuts


class _ScriptedWhisper:
    """Answers every decode with one word per half second of audio; counts the decodes."""

    def __init__(self) -> None:
        self.decodes = 0

    def transcribe(self, audio, **options):
        from types import SimpleNamespace

        self.decodes += 1
        seconds = audio.size / 16000
        words = [SimpleNamespace(word=f" w{i}", start=i * 0.5, end=i * 0.5 + 0.4) for i in range(int(seconds * 2))]
        segment = SimpleNamespace(words=words, text="".join(w.word for w in words), start=0.0, end=seconds)
        return [segment], None


class _BusyLock(FairLock):
    """The shared model's lock as other sessions would keep it: `others` of them waiting for it."""

    def __init__(self, others: int) -> None:
        super().__init__()
        self.others = others

    @property
    def waiting(self) -> int:
        return self.others


def test_partials_are_spaced_out_while_other_sessions_wait_for_the_model():
    audio = np.concatenate([silence(0.5), load_audio_16k(CLIPS["0930"].path), silence(1.0)])
    decodes = {}
    for others in (0, 3):
        whisper = _ScriptedWhisper()
        asyncio.run(stream(LoadedModel("scripted", whisper, _BusyLock(others)), audio, settle=True))
        decodes[others] = whisper.decodes
    assert decodes[3] * 2 < decodes[0]  # partials every ~1 s instead of every 0.25 s; the final still decoded
    assert decodes[3] >= 2


class _WatchedWhisper(_ScriptedWhisper):
    """Also notes, for each decode, the newest window's speech probability and whether the voice was still on."""

    def __init__(self) -> None:
        super().__init__()
        self.stage: ListenStage | None = None
        self.at: list[tuple[float, bool]] = []

    def transcribe(self, audio, **options):
        assert self.stage is not None
        endpointer = self.stage._endpointer
        self.at.append((endpointer.last_probability, endpointer.position - endpointer.last_voiced_end < 512))
        return super().transcribe(audio, **options)


def test_no_partial_starts_while_the_voice_fades_so_the_likely_final_never_waits_behind_one(monkeypatch):
    """A partial started in the last windows of speech is still decoding when the likely final is due; the stage
    starts none while the speech probability is falling below FADING_PROBABILITY (unless one is long overdue)."""
    from voice.listen import stage as stage_module

    audio = np.concatenate([silence(0.5)] + [np.concatenate([load_audio_16k(CLIPS[c].path), silence(0.7)])
                                            for c in STREAMED])

    def partial_probabilities() -> list[float]:
        whisper = _WatchedWhisper()
        stage = ListenStage("test", recorder([]), model=LoadedModel("scripted", whisper, FairLock()))
        whisper.stage = stage

        async def run() -> None:
            async def send(chunk: bytes) -> None:
                await stage.accept(chunk)
                await stage.wait_for_decodes()

            await stream_pcm16(send, float32_to_pcm16(audio), rate=16000, frame_ms=32)
            await stage.flush()

        asyncio.run(run())
        return [probability for probability, voiced in whisper.at if voiced]

    from model.spare_cores import SpareCores

    handovers: list[tuple[float, float, int]] = []

    class Gauge:
        def handed_over(self, start: float, end: float, threads: int = 1) -> None:
            handovers.append((start, end, threads))

    monkeypatch.setattr(SpareCores, "running", classmethod(lambda cls: Gauge()))
    fading = stage_module.FADING_PROBABILITY
    assert all(p >= fading for p in partial_probabilities())
    # each likely final, which an answer follows, handed its core over (model/spare_cores.py)
    assert len(handovers) >= len(STREAMED)  # a pause inside a segment gives a likely final too
    assert all(start < end and threads == 1 for start, end, threads in handovers)
    monkeypatch.setattr(stage_module, "FADING_PROBABILITY", 0.0)  # the rule off: partials start in fading windows
    assert any(p < fading for p in partial_probabilities())


def test_the_silence_after_the_last_word_counts_before_the_endpointer_ends_the_segment():
    """The listener's silence grows from the first quiet VAD window on, inside the open segment too: the session may
    release an answer before the segment's end (voice/turn/machine.py), on this count."""
    audio = np.concatenate([silence(0.5), load_audio_16k(CLIPS["0880"].path), silence(0.6)])
    events: list[Event] = []
    stage = ListenStage("test", recorder(events), model=LoadedModel("scripted", _ScriptedWhisper(), FairLock()))
    before_end: list[float] = []

    async def run() -> None:
        async def send(chunk: bytes) -> None:
            await stage.accept(chunk)
            if any(isinstance(e, SpeechStart) for e in events) and not any(isinstance(e, SpeechEnd) for e in events):
                before_end.append(stage.silence_ms)

        await stream_pcm16(send, float32_to_pcm16(audio), rate=16000, frame_ms=32)

    asyncio.run(run())
    assert any(isinstance(e, SpeechEnd) for e in events)
    assert before_end[0] == 0.0 and 250 <= max(before_end) < 352  # counted up to the segment's end at 320 ms
    assert stage.silence_ms >= 560  # and on after it, as before
