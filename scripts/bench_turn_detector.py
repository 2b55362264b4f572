"""Benchmark semantic end-of-turn detection (Smart Turn v3.2): accuracy and CPU time. Prints a table; asserts nothing.

Each recording gives one complete utterance and several incomplete ones, all ending in the same trailing silence
(what the detector hears when the session asks it, `detect_after_ms` into a pause):
- complete: the whole utterance, cut at its last voiced sample (Silero VAD);
- cut at a pause: cut where an internal pause (>= 64 ms of non-speech) starts: the case that made the silence rule end
  turns mid-thought;
- cut mid-phrase: cut between two words right after a function word ("the", "to", "for"...), which leaves the sentence
  unfinished whatever the prosody; word boundaries from faster-whisper word timestamps, moved to the quietest 10 ms
  nearby and checked by transcribing what is left (see `word_cuts`).
Recordings: the LibriVox clips of pocketsphinx-testdata, the spoken alsa-utils test sounds (complete only: two words
each), and Piper sentences of this script's own with a comma pause inside (none of them is used by the tests).
The trailing silence is the recording's own room tone (its lead-in before speech), digital silence for Piper.

A verdict is right when a complete utterance scores above the threshold and an incomplete one does not. Labels are
mechanical: a cut can leave a sentence that is complete in itself ("Can you remind me"), which the model is right to
call complete; the per-cut rows of --json show them.

    python scripts/bench_turn_detector.py [--trailing-ms 100,200,400] [--json artifacts/bench_turn_detector.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report_lib.speech_samples import librivox_clips  # noqa: E402
from report_lib.stats import percentile  # noqa: E402

from voice.io.audio import load_audio_16k, pcm16_to_float32, resample  # noqa: E402
from voice.listen.turn_detector import (  # noqa: E402
    SAMPLE_RATE,
    SmartTurn,
    TurnDetectorConfig,
    log_mel_features,
    model_window,
)
from voice.listen.vad import FRAME_SAMPLES, SileroVad  # noqa: E402

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
    source: str  # librivox | alsa | piper
    audio: np.ndarray  # 16 kHz mono float32
    room_tone: np.ndarray  # what the silence after a cut sounds like
    cuts_mid_phrase: bool


@dataclass(frozen=True, slots=True)
class Case:
    recording: str
    source: str
    kind: str  # complete | cut_at_pause | cut_mid_phrase
    cut_s: float
    words_before_cut: str
    trailing_ms: int
    probability: float

    @property
    def complete(self) -> bool:
        return self.kind == "complete"


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
    for clip in librivox_clips():
        audio = load_audio_16k(clip.path)
        first, _, _ = speech_bounds_and_pauses(audio)
        tone = audio[: max(first - SAMPLE_RATE // 10, SAMPLE_RATE // 20)]
        recordings.append(Recording(clip.clip_id, "librivox", audio, tone, cuts_mid_phrase=True))
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


def evaluate(detector: SmartTurn, recordings: list[Recording], trailing: list[int], whisper: object) -> list[Case]:
    cases = []
    for recording in recordings:
        audio = recording.audio
        _, last_voiced, pauses = speech_bounds_and_pauses(audio)
        if last_voiced == 0:
            continue
        cuts = [("complete", last_voiced, "")] + [("cut_at_pause", cut, "") for cut in pauses]
        if recording.cuts_mid_phrase and whisper is not None:
            cuts += [("cut_mid_phrase", cut, words) for cut, words in word_cuts(audio, whisper)]
        for kind, cut, words in cuts:
            for trailing_ms in trailing:
                probability = detector.probability(with_silence(audio, cut, recording.room_tone, trailing_ms))
                case = Case(recording.name, recording.source, kind, round(cut / SAMPLE_RATE, 3), words, trailing_ms,
                            round(probability, 4))
                cases.append(case)
    return cases


def cpu_times(detector: SmartTurn, recordings: list[Recording], calls: int) -> dict[str, float]:
    """CPU seconds per call (process time: all threads), whole call and features alone, over `calls` calls."""
    whole, features = [], []
    inputs = [recording.audio for recording in recordings]
    detector.probability(inputs[0])  # the first run of an ONNX session allocates its buffers
    for call in range(calls):
        audio = inputs[call % len(inputs)]
        start = time.process_time()
        log_mel_features(model_window(audio))
        features.append(time.process_time() - start)
        start = time.process_time()
        detector.probability(audio)
        whole.append(time.process_time() - start)
    return {
        "calls": calls,
        "call_ms_median": round(1000 * statistics.median(whole), 1),
        "call_ms_p90": round(1000 * percentile(whole, 90), 1),
        "features_ms_median": round(1000 * statistics.median(features), 1),
        "features_ms_p90": round(1000 * percentile(features, 90), 1),
    }


def summarise(cases: list[Case], threshold: float) -> list[dict[str, object]]:
    rows = []
    groups = sorted({(c.trailing_ms, c.source, c.kind) for c in cases})
    groups += sorted({(c.trailing_ms, "all", c.kind) for c in cases})
    for trailing_ms, source, kind in groups:
        chosen = [c for c in cases if c.trailing_ms == trailing_ms and c.kind == kind and source in ("all", c.source)]
        right = [(c.probability > threshold) == c.complete for c in chosen]
        rows.append({
            "trailing_ms": trailing_ms, "source": source, "kind": kind, "n": len(chosen),
            "accuracy": round(sum(right) / len(chosen), 3),
            "mean_probability": round(statistics.fmean(c.probability for c in chosen), 3),
        })
    for trailing_ms in sorted({c.trailing_ms for c in cases}):
        chosen = [c for c in cases if c.trailing_ms == trailing_ms]
        complete = [c for c in chosen if c.complete]
        cut = [c for c in chosen if not c.complete]
        balanced = 0.5 * (sum(c.probability > threshold for c in complete) / len(complete)
                          + sum(c.probability <= threshold for c in cut) / len(cut))
        rows.append({"trailing_ms": trailing_ms, "source": "all", "kind": "balanced", "n": len(chosen),
                     "accuracy": round(balanced, 3), "mean_probability": None, "auc": auc(complete, cut)})
    return rows


def auc(complete: list[Case], cut: list[Case]) -> float:
    """Chance that a complete utterance scores above an incomplete one: the separation, whatever the threshold."""
    wins = [(a.probability > b.probability) + 0.5 * (a.probability == b.probability) for a in complete for b in cut]
    return round(statistics.fmean(wins), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trailing-ms", default="200", help="comma-separated silences after each cut (default 200)")
    parser.add_argument("--calls", type=int, default=60, help="calls for the CPU-time figures")
    parser.add_argument("--no-piper", action="store_true", help="skip the Piper sentences")
    parser.add_argument("--no-word-cuts", action="store_true", help="skip the Whisper-aligned mid-phrase cuts")
    parser.add_argument("--json", type=Path, help="write figures and every case here")
    args = parser.parse_args()
    trailing = [int(value) for value in args.trailing_ms.split(",")]

    config = TurnDetectorConfig()
    detector = SmartTurn.load(config)
    recordings = load_recordings(piper=not args.no_piper)
    if not recordings:
        sys.exit("no recordings: install pocketsphinx-testdata and alsa-utils (make system-packages)")
    whisper = None
    if not args.no_word_cuts:
        from voice.listen.asr_models import load_model

        whisper = load_model().model
    cases = evaluate(detector, recordings, trailing, whisper)
    rows = summarise(cases, config.threshold)
    timing = cpu_times(detector, recordings, args.calls)

    print(f"Smart Turn v3.2, threshold {config.threshold}, {len(recordings)} recordings, {len(cases)} cases")
    print(f"{'trailing':>8}  {'source':<9} {'kind':<15} {'n':>4} {'accuracy':>9} {'mean p':>9}")
    for row in rows:
        mean = f"AUC {row['auc']:.3f}" if row["mean_probability"] is None else f"{row['mean_probability']:.3f}"
        print(f"{row['trailing_ms']:>6}ms  {row['source']:<9} {row['kind']:<15} {row['n']:>4} "
              f"{row['accuracy']:>9.3f} {mean:>9}")
    print(f"CPU per call (1 intra-op thread, {timing['calls']} calls): median {timing['call_ms_median']} ms, "
          f"p90 {timing['call_ms_p90']} ms; of which features median {timing['features_ms_median']} ms, "
          f"p90 {timing['features_ms_p90']} ms")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"threshold": config.threshold, "summary": rows, "cpu": timing,
                  "cases": [asdict(case) for case in cases]}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
