"""The spoken user turns a report runs: the caller's WAV files, or a built-in set.

The built-in set is a few short questions synthesised once with the bundled Piper voice (resampled to 16 kHz and
cached, so later runs cost nothing), plus the real recorded speech of Debian's pocketsphinx-testdata when installed.
Synthetic speech is clean and well articulated; the LibriVox and "cards" recordings keep the report honest about
real voices.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import soundfile

from model.disk_cache import cache_root
from scripts.report_lib.speech_samples import TESTDATA_DIR
from voice.audio import TARGET_RATE, load_audio_16k, pcm16_to_float32, resample

CACHE_DIR = cache_root() / "report-audio"
QUESTIONS: tuple[str, ...] = (
    "What is the capital of France?",
    "Tell me a fun fact about octopuses.",
    "How do I boil an egg?",
    "Can you recommend a good book?",
    "Why is the sky blue?",
    "What should I cook for dinner tonight?",
    "How far away is the moon?",
    "Give me a tip for sleeping better.",
)
LEAD_SILENCE_S = 0.3  # a microphone hears a moment of room before the user speaks
# Conversational turns that no test, no training prompt and no other report uses (`--conversational`): questions an
# assistant hears, half of them spoken in two parts with a pause inside, as people do when they think as they talk.
CONVERSATIONAL: tuple[tuple[str, ...], ...] = (
    ("Could you remind me what a prime number is?",),
    ("Is it going to be cold this evening?",),
    ("What's a quick dinner I can make with pasta?",),
    ("How many hours of sleep does a teenager need?",),
    ("Tell me something cheerful.",),
    ("Which is bigger, a lion or a tiger?",),
    ("So I have a question.", "How do airplanes stay in the air?"),
    ("Okay, and then.", "What should I pack for a beach holiday?"),
    ("I was thinking about dinner.", "Is rice healthier than potatoes?"),
    ("Hmm, let me see.", "What year did the first person walk on the moon?"),
    ("My friend told me something.", "Do goldfish really have a short memory?"),
    ("Before I forget.", "How do I say thank you in Italian?"),
)
PAUSE_S = 0.6  # between the two parts of a conversational turn: longer than a segment end, shorter than a new turn


class InputError(Exception):
    """An input that cannot be used (not audio, no files in a folder); the message names it."""


def synthesised_questions(cache_dir: Path = CACHE_DIR, questions: Sequence[str] = QUESTIONS) -> list[Path]:
    """One 16 kHz WAV per question, synthesised with the bundled voice on first use and cached by text and voice."""
    from voice.speak.tts import TTSConfig, load_synthesizer, resolve_voice_paths

    model_path, _ = resolve_voice_paths(TTSConfig())
    voice_tag = hashlib.sha256(f"{model_path.name}:{model_path.stat().st_size}".encode()).hexdigest()[:8]
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for question in questions:
        digest = hashlib.sha256(question.encode()).hexdigest()[:12]
        path = cache_dir / f"{voice_tag}-{digest}.wav"
        if not path.is_file():
            synthesizer = load_synthesizer(TTSConfig())
            pcm = b"".join(synthesizer.synthesize(question))
            speech = resample(pcm16_to_float32(pcm), synthesizer.sample_rate, TARGET_RATE)
            lead = np.zeros(int(LEAD_SILENCE_S * TARGET_RATE), np.float32)
            partial = path.with_suffix(".part.wav")
            soundfile.write(partial, np.concatenate([lead, speech]), TARGET_RATE, subtype="PCM_16")
            partial.replace(path)  # atomic: an interrupted run never leaves half a clip in the cache
        paths.append(path)
    return paths


def conversational_turns(cache_dir: Path = CACHE_DIR) -> list[Path]:
    """The `CONVERSATIONAL` turns as 16 kHz WAVs: each part synthesised with the bundled voice, parts joined by
    `PAUSE_S` of silence, cached like `synthesised_questions`."""
    texts = sorted({part for turn in CONVERSATIONAL for part in turn})
    audio = dict(zip(texts, synthesised_questions(cache_dir, texts), strict=True))
    paths = []
    for turn in CONVERSATIONAL:
        if len(turn) == 1:
            paths.append(audio[turn[0]])
            continue
        digest = hashlib.sha256(" | ".join(turn).encode()).hexdigest()[:12]
        path = cache_dir / f"{audio[turn[0]].stem.split('-')[0]}-pause-{digest}.wav"
        if not path.is_file():
            pause = np.zeros(int(PAUSE_S * TARGET_RATE), np.float32)
            first = load_audio_16k(audio[turn[0]])
            second = load_audio_16k(audio[turn[1]])[int(LEAD_SILENCE_S * TARGET_RATE):]  # its own lead-in dropped
            partial = path.with_suffix(".part.wav")
            soundfile.write(partial, np.concatenate([first, pause, second]), TARGET_RATE, subtype="PCM_16")
            partial.replace(path)
        paths.append(path)
    return paths


def recorded_speech(testdata: Path = TESTDATA_DIR) -> list[Path]:
    """The real-speech clips of pocketsphinx-testdata (LibriVox sentences, spoken card names); empty when absent."""
    return sorted((testdata / "librivox").glob("*.wav")) + sorted((testdata / "cards").glob("*.wav"))


def builtin_inputs() -> list[Path]:
    """Synthesised questions first (they are what an assistant hears), then recorded speech, interleaved so that a
    short `--turns` still sees both kinds."""
    synthetic, recorded = synthesised_questions(), recorded_speech()
    mixed: list[Path] = []
    for index in range(max(len(synthetic), len(recorded))):
        mixed.extend(group[index] for group in (synthetic, recorded) if index < len(group))
    return mixed


def resolve_inputs(files: Sequence[Path], audio_dir: Path | None, conversational: bool = False) -> list[Path]:
    """The caller's files (and the WAVs of `audio_dir`), else the built-in set; with `conversational`, the
    conversational turns after them. Raises InputError for a folder without WAV files or a missing file."""
    paths = list(files)
    if audio_dir is not None:
        found = sorted(audio_dir.glob("*.wav"))
        if not found:
            raise InputError(f"no .wav files in {audio_dir}")
        paths.extend(found)
    for path in paths:
        if not path.is_file():
            raise InputError(f"input not found: {path}")
    return (paths or builtin_inputs()) + (conversational_turns() if conversational else [])


def check_audio(paths: Sequence[Path]) -> None:
    """Read every input once up front, so a file that is not audio fails before minutes of model work
    (raises voice.errors.AudioFormatError naming the file)."""
    for path in paths:
        load_audio_16k(path)


def pick_turns(paths: Sequence[Path], turns: int | None) -> list[Path]:
    """`turns` inputs, cycling through the list when more turns than files are asked for; all of them when None."""
    if not paths:
        raise InputError("no inputs")
    if turns is None:
        return list(paths)
    if turns < 1:
        raise InputError("--turns must be at least 1")
    return [paths[index % len(paths)] for index in range(turns)]
