"""Benchmark semantic end-of-turn detection (Smart Turn v3.2): accuracy and CPU time. Prints a table; asserts nothing.

Each recording gives one complete utterance and several incomplete ones, all ending in the same trailing silence
(what the detector hears when the session asks it, `detect_after_ms` into a pause):
- complete: the whole utterance, cut at its last voiced sample (Silero VAD);
- cut at a pause: cut where an internal pause (>= 64 ms of non-speech) starts: the case that made the silence rule end
  turns mid-thought;
- cut mid-phrase: cut between two words right after a function word ("the", "to", "for"...), which leaves the sentence
  unfinished whatever the prosody; word boundaries from faster-whisper word timestamps, moved to the quietest 10 ms
  nearby and checked by transcribing what is left (see `word_cuts`).
Recordings: the LibriVox clips and the eight short spoken commands of pocketsphinx-testdata (card names, "go forward
ten meters"), the spoken alsa-utils test sounds (not cut mid-phrase: two words each), and Piper sentences with a comma
pause inside (scripts/report_lib/turn_cases.py; no test uses them).
The trailing silence is the recording's own room tone (its lead-in before speech), digital silence for Piper.

A verdict is right when a complete utterance scores above the threshold and an incomplete one does not. Labels are
mechanical: a cut can leave a sentence that is complete in itself ("Can you remind me"), which the model is right to
call complete; the per-cut rows of --json show them.

    python scripts/bench/bench_turn_detector.py [--trailing-ms 100,200,400] [--json artifacts/bench_turn_detector.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from scripts.report_lib.stats import auc, percentile
from scripts.report_lib.turn_cases import (
    Recording,
    load_recordings,
    speech_bounds_and_pauses,
    with_silence,
    word_cuts,
)
from voice.engines import keep_numpy_blas_on_its_caller
from voice.listen.turn_detector import (
    SAMPLE_RATE,
    SmartTurn,
    TurnDetectorConfig,
    log_mel_features,
    model_window,
)


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
        separation = auc([c.probability for c in complete], [c.probability for c in cut])
        rows.append({"trailing_ms": trailing_ms, "source": "all", "kind": "balanced", "n": len(chosen),
                     "accuracy": round(balanced, 3), "mean_probability": None, "auc": separation})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trailing-ms", default="200", help="comma-separated silences after each cut (default 200)")
    parser.add_argument("--calls", type=int, default=60, help="calls for the CPU-time figures")
    parser.add_argument("--no-piper", action="store_true", help="skip the Piper sentences")
    parser.add_argument("--no-word-cuts", action="store_true", help="skip the Whisper-aligned mid-phrase cuts")
    parser.add_argument("--json", type=Path, help="write figures and every case here")
    args = parser.parse_args()
    trailing = [int(value) for value in args.trailing_ms.split(",")]

    keep_numpy_blas_on_its_caller()  # as in a voice process: the CPU figures are what a call costs there
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
