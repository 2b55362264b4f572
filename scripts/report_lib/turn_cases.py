"""The turn-detector benchmark's material: recordings (LibriVox, alsa-utils, short recorded commands, Piper sentences),
where each is cut
(complete, at an internal pause, mid-phrase after a function word) and the silence heard after a cut. Shared by
scripts/bench/bench_turn_detector.py (Smart Turn's accuracy) and scripts/train/fit_end_of_turn.py (the fitted
end-of-turn rule), so both judge the same cases."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scripts.report_lib.speech_samples import card_clips, command_recordings, librivox_clips
from voice.audio import load_audio_16k, pcm16_to_float32, resample
from voice.listen.turn_detector import SAMPLE_RATE
from voice.listen.vad import FRAME_SAMPLES, SileroVad

ALSA_DIR = Path("/usr/share/sounds/alsa")
PIPER_SENTENCES = [
    "If it rains tomorrow, should I take the bus or the train?",
    "When you get a chance, could you check my calendar for Friday?",
    "Before we start, can you tell me how long this will take?",
    "Tell me, in a few words, how a rainbow forms.",
    "So what I wanted to ask is, how long does it take to boil an egg?",
    "My brother and I, we were wondering, is the museum open on Mondays?",
    "Could you find me a recipe that uses chicken, rice, and a little lemon?",
    "I need to buy milk, eggs, and bread on the way home.",
    "What do you think, would a jacket be enough for the mountains in May?",
    "After the meeting, remind me to send the report to Sarah.",
    "Please set a timer for ten minutes, and tell me when it ends.",
    "Honestly, I think we should leave a little earlier tomorrow.",
    "Add apples, butter, and flour to my shopping list.",
    "Call my sister, then send her the photos from the trip.",
    "By the way, the package you ordered arrived this morning.",
    "Read me the first chapter, slowly, from the beginning.",
    "If you have time later, explain how vaccines work.",
    "Thanks, that was exactly what I needed.",
    "Next week, I start a new job at the hospital.",
    "Open the window, it is getting warm in here.",
]
FUNCTION_WORDS = frozenset([
    "a", "an", "the", "to", "for", "of", "in", "at", "on", "with", "from", "by", "and", "or", "but", "if", "when",
    "what", "which", "that", "my", "your", "his", "her", "our", "their", "is", "was", "be", "been", "have", "had",
    "would", "could", "will", "can", "than", "as",
])
MIN_PAUSE_WINDOWS = 2  # 64 ms of non-speech inside an utterance counts as a pause


@dataclass(frozen=True, slots=True)
class Recording:
    name: str
    source: str  # librivox | alsa | commands | piper
    audio: np.ndarray  # 16 kHz mono float32
    room_tone: np.ndarray  # what the silence after a cut sounds like
    cuts_mid_phrase: bool


def vad_probabilities(audio: np.ndarray) -> np.ndarray:
    return np.array(SileroVad().push(audio))


def speech_bounds_and_pauses(audio: np.ndarray) -> tuple[int, int, list[int]]:
    """First voiced sample, one past the last, and the start of every internal pause (Silero VAD, as the session)."""
    probabilities = vad_probabilities(audio)
    voiced = np.flatnonzero(probabilities > 0.5)
    if voiced.size == 0:
        return 0, 0, []
    speech = probabilities > 0.35  # the endpointer's release threshold: a soft syllable is still speech
    pauses, window = [], int(voiced[0])
    while window < voiced[-1]:
        if speech[window]:
            window += 1
            continue
        end = window
        while not speech[end]:
            end += 1
        if end - window >= MIN_PAUSE_WINDOWS:
            pauses.append(window * FRAME_SAMPLES)
        window = end
    return int(voiced[0]) * FRAME_SAMPLES, (int(voiced[-1]) + 1) * FRAME_SAMPLES, pauses


def quietest_point(audio: np.ndarray, start: int, end: int) -> int:
    """Middle of the quietest 10 ms between `start` and `end`: a cut there lands between words, not inside one."""
    frame = SAMPLE_RATE // 100
    start, end = max(start, 0), min(end, audio.size)
    if end - start <= frame:
        return (start + end) // 2
    energies = [float(np.mean(audio[i : i + frame] ** 2)) for i in range(start, end - frame, frame // 4)]
    return start + int(np.argmin(energies)) * (frame // 4) + frame // 2


def transcribe_words(audio: np.ndarray, whisper: object) -> list:  # -> list[faster_whisper Word]
    segments, _ = whisper.transcribe(  # type: ignore[attr-defined]
        audio, language="en", beam_size=1, word_timestamps=True, condition_on_previous_text=False
    )
    return [word for segment in segments for word in segment.words]


def bare(word: str) -> str:
    return word.strip(" ,.?!;:-").lower()


def word_cuts(audio: np.ndarray, whisper: object) -> list[tuple[int, str]]:
    """Cut points right after a function word, with the words before the cut.

    Whisper's word edges are rough (tiny.en puts each word's end at the next word's start, often after its onset), so
    the cut is the quietest 10 ms a little before that edge, and it is kept only when the audio before it is
    transcribed ending with that function word; a second, earlier window is tried when the first fails."""
    words = transcribe_words(audio, whisper)
    cuts = []
    for index, (word, _following) in enumerate(itertools.pairwise(words)):
        if bare(word.word) not in FUNCTION_WORDS:
            continue
        edge = int(word.end * SAMPLE_RATE)
        for start_ms, end_ms in ((-200, 10), (-320, -100)):
            cut = quietest_point(audio, edge + SAMPLE_RATE * start_ms // 1000, edge + SAMPLE_RATE * end_ms // 1000)
            left = transcribe_words(np.concatenate([audio[:cut], np.zeros(SAMPLE_RATE // 2, np.float32)]), whisper)
            if left and bare(left[-1].word) == bare(word.word):
                cuts.append((cut, "".join(w.word for w in words[: index + 1]).strip()))
                break
    return cuts


def with_silence(audio: np.ndarray, cut: int, room_tone: np.ndarray, trailing_ms: int) -> np.ndarray:
    return np.concatenate([audio[:cut], np.resize(room_tone, SAMPLE_RATE * trailing_ms // 1000)]).astype(np.float32)


def load_recordings(piper: bool) -> list[Recording]:
    recordings = []
    recorded = [(clip.clip_id, "librivox", load_audio_16k(clip.path)) for clip in librivox_clips()]
    recorded += [(f"cards-{clip.clip_id}", "commands", load_audio_16k(clip.path)) for clip in card_clips()]
    recorded += [(name, "commands", pcm16_to_float32(path.read_bytes())) for name, path in command_recordings()]
    for name, source, audio in recorded:  # read sentences, and short real turns: a card's name, "go forward ten meters"
        first, _, _ = speech_bounds_and_pauses(audio)
        tone = audio[: max(first - SAMPLE_RATE // 10, SAMPLE_RATE // 20)]
        recordings.append(Recording(name, source, audio, tone, cuts_mid_phrase=True))
    for path in sorted(ALSA_DIR.glob("*.wav")):
        if path.stem == "Noise":
            continue
        audio = load_audio_16k(path)
        first, _, _ = speech_bounds_and_pauses(audio)
        tone = audio[: first - SAMPLE_RATE // 20] if first > SAMPLE_RATE // 10 else np.zeros(160, dtype=np.float32)
        recordings.append(Recording(path.stem, "alsa", audio, tone, cuts_mid_phrase=False))
    if piper:
        from voice.speak.tts import load_synthesizer

        synthesizer = load_synthesizer()
        for index, sentence in enumerate(PIPER_SENTENCES):
            pcm = b"".join(synthesizer.synthesize(sentence))
            audio = resample(pcm16_to_float32(pcm), synthesizer.sample_rate)
            silence = np.zeros(160, dtype=np.float32)
            recordings.append(Recording(f"piper-{index:02d}", "piper", audio, silence, cuts_mid_phrase=True))
    return recordings
