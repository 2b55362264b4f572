"""Fit, and report on held-out recordings, the end-of-turn rule that combines Smart Turn's ear with the LM's words.

Cases are the turn-detector benchmark's (scripts/bench/bench_turn_detector.py): each recording cut where it is complete,
at an internal pause and mid-phrase, 200 ms of its own room tone after the cut. For each case this script records what
the session would know when it decides the pause: Smart Turn v3.2's probability on the audio, Whisper tiny.en's
transcript of the cut (beam 1, as the listener's likely final), and the bundled LM's probability of `<|im_end|>`
right after the transcript's last word, read from the first pass of a real answer to it (the prompt's known part
encoded ahead, as a voice session does, so the words are folded into that pass: model/decoding/end_of_turn.py).

Split: recordings, not cases, are split, so no recording's cuts are on both sides. Within each source (librivox,
alsa, commands, piper), recordings sorted by name alternate fit / held out, starting with fit. The rule's weights and
threshold (voice/end_of_turn.py) are fitted on the fit recordings only; every figure printed for "held out" comes
from the other recordings. A second view uses every recording: each is judged by the rule fitted on all the others
("each left out"), so each figure there also comes from a rule that never saw that recording. A rule is right on a
complete utterance when it releases it without the long hold (the short wait), and right on a cut when it holds it.

    python scripts/train/fit_end_of_turn.py [--json artifacts/end_of_turn_fit.json] [--cases-in FILE] [--shipped]

`--cases-in` refits from the cases of an earlier `--json` without running the models again. `--shipped` judges the
shipped defaults instead of fitting: Piper samples its voice anew each run, so a new collection is new material.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from scripts.report_lib.stats import auc
from scripts.report_lib.turn_cases import load_recordings, speech_bounds_and_pauses, with_silence, word_cuts
from scripts.train.end_of_turn_fit import fit_rule
from voice.end_of_turn import EndOfTurnRule, Signals
from voice.listen.words import asks_a_question, trails_off
from voice.think.spoken import SPOKEN_SYSTEM_PROMPT

TRAILING_MS = 200


@dataclass(frozen=True, slots=True)
class Case:
    recording: str
    source: str
    kind: str  # complete | cut_at_pause | cut_mid_phrase
    transcript: str
    audio_probability: float
    text_probability: float | None
    text_ms: float  # CPU time of reading the probability out of the first pass (the softmax over one row)

    @property
    def complete(self) -> bool:
        return self.kind == "complete"

    def signals(self) -> Signals:
        return Signals(self.audio_probability, self.text_probability, asks_a_question(self.transcript),
                       trails_off(self.transcript))


def collect() -> list[Case]:
    """Run Smart Turn, Whisper and the LM on every case of the turn-detector benchmark."""
    from model.bundled.default_model import load_default_chat_model
    from model.chat import ChatMessage, GenerationOptions
    from voice.listen.asr_models import load_model
    from voice.listen.turn_detector import SmartTurn, TurnDetectorConfig

    detector = SmartTurn.load(TurnDetectorConfig())
    whisper = load_model().model
    lm = load_default_chat_model()
    recordings = load_recordings(piper=True)
    cases: list[Case] = []
    for recording in recordings:
        audio = recording.audio
        _, last_voiced, pauses = speech_bounds_and_pauses(audio)
        if last_voiced == 0:
            continue
        cuts = [("complete", last_voiced)] + [("cut_at_pause", cut) for cut in pauses]
        if recording.cuts_mid_phrase:
            cuts += [("cut_mid_phrase", cut) for cut, _words in word_cuts(audio, whisper)]
        for kind, cut in cuts:
            heard = with_silence(audio, cut, recording.room_tone, TRAILING_MS)
            audio_probability = detector.probability(heard)
            segments, _ = whisper.transcribe(heard, language="en", beam_size=1, condition_on_previous_text=False)
            transcript = " ".join(segment.text.strip() for segment in segments).strip()
            text_probability, text_ms = None, 0.0
            if transcript:  # the known part of the prompt encoded ahead, the spoken system prompt: as in a session
                lm.prepare([], conversation="fit", system_prompt=SPOKEN_SYSTEM_PROMPT)
                options = GenerationOptions(max_new_tokens=1, interactive=True, conversation="fit",
                                            system_prompt=SPOKEN_SYSTEM_PROMPT)
                started = time.process_time()
                drafts = list(lm.stream_chat([ChatMessage("user", transcript)], options))
                text_probability = drafts[0].end_of_turn
                text_ms = 1000 * (time.process_time() - started)
            cases.append(Case(recording.name, recording.source, kind, transcript, round(audio_probability, 4),
                              None if text_probability is None else round(text_probability, 6), round(text_ms, 1)))
            print(f"{recording.name:<14} {kind:<15} audio {audio_probability:.3f} text "
                  f"{text_probability if text_probability is None else round(text_probability, 3)!s:<6} "
                  f"{transcript!r}", flush=True)
    return cases


def split(cases: list[Case]) -> tuple[set[str], set[str]]:
    """(fit recordings, held-out recordings): alternating by name within each source."""
    fit, held = set(), set()
    for source in sorted({case.source for case in cases}):
        names = sorted({case.recording for case in cases if case.source == source})
        for index, name in enumerate(names):
            (fit if index % 2 == 0 else held).add(name)
    return fit, held


def figures(cases: list[Case], released: list[bool], scores: list[float]) -> dict[str, object]:
    """Share of complete utterances released at the short wait, of cuts held, and the score's AUC."""
    def share(kind: str, want_release: bool) -> tuple[float, int]:
        chosen = [r for case, r in zip(cases, released, strict=True) if case.kind == kind]
        right = [r == want_release for r in chosen]
        return (round(sum(right) / len(right), 3) if right else float("nan")), len(right)

    complete, n_complete = share("complete", True)
    pause, n_pause = share("cut_at_pause", False)
    mid, n_mid = share("cut_mid_phrase", False)
    c_scores = [s for case, s in zip(cases, scores, strict=True) if case.complete]
    x_scores = [s for case, s in zip(cases, scores, strict=True) if not case.complete]
    return {"complete_released": complete, "n_complete": n_complete, "cut_at_pause_held": pause,
            "n_cut_at_pause": n_pause, "cut_mid_phrase_held": mid, "n_cut_mid_phrase": n_mid,
            "auc": auc(c_scores, x_scores)}


def report(name: str, cases: list[Case], rule: EndOfTurnRule) -> dict[str, dict[str, object]]:
    """Smart Turn alone (today's rule: its verdict, plus the trailing-off rule) against the combined rule."""
    short = rule.complete_ms
    today = [rule.wait_ms(case.signals()._replace(text=None)) <= short for case in cases]
    combined = [rule.wait_ms(case.signals()) <= short for case in cases]
    out = {
        "smart_turn_alone": figures(cases, today, [case.audio_probability for case in cases]),
        "combined": figures(cases, combined, [rule.score(case.signals()) or 0.0 for case in cases]),
    }
    print(f"\n{name}: {len({c.recording for c in cases})} recordings, {len(cases)} cases")
    print(f"{'rule':<18} {'complete released':>18} {'pause cuts held':>16} {'mid-phrase held':>16} {'AUC':>6}")
    for label, row in out.items():
        print(f"{label:<18} {row['complete_released']:>11.3f} (n={row['n_complete']:>2}) "
              f"{row['cut_at_pause_held']:>9.3f} (n={row['n_cut_at_pause']:>2}) "
              f"{row['cut_mid_phrase_held']:>9.3f} (n={row['n_cut_mid_phrase']:>2}) {row['auc']:>6.3f}")
    return out


def fit(cases: list[Case]) -> EndOfTurnRule:
    return fit_rule([case.signals() for case in cases], [case.complete for case in cases],
                    [case.recording for case in cases])


def each_left_out(cases: list[Case]) -> dict[str, object]:
    """Every recording judged by the rule fitted on all the other recordings."""
    judged: list[tuple[Case, bool, float]] = []
    names = sorted({case.recording for case in cases})
    for name in names:
        rule = fit([case for case in cases if case.recording != name])
        for case in cases:
            if case.recording == name:
                judged.append((case, rule.wait_ms(case.signals()) <= rule.complete_ms,
                               rule.score(case.signals()) or 0.0))
    out = figures([c for c, _, _ in judged], [r for _, r, _ in judged], [s for _, _, s in judged])
    print(f"\neach recording left out in turn ({len(names)} fits): complete released "
          f"{out['complete_released']:.3f} (n={out['n_complete']}), pause cuts held {out['cut_at_pause_held']:.3f} "
          f"(n={out['n_cut_at_pause']}), mid-phrase held {out['cut_mid_phrase_held']:.3f} "
          f"(n={out['n_cut_mid_phrase']}); the AUC mixes {len(names)} rules' scores: "
          f"{out['auc']:.3f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the cases, the fitted rule and the figures here")
    parser.add_argument("--cases-in", type=Path, help="refit from the cases of an earlier --json")
    parser.add_argument("--shipped", action="store_true",
                        help="report the shipped defaults (voice/end_of_turn.py) instead of a new fit: a fresh "
                             "collection judges the rule the assistant runs")
    args = parser.parse_args()
    cases = [Case(**row) for row in json.loads(args.cases_in.read_text())["cases"]] if args.cases_in else collect()
    usable = [case for case in cases if case.text_probability is not None]
    if len(usable) < len(cases):
        print(f"{len(cases) - len(usable)} cases without words (Whisper heard none): left out")
    fit_names, held_names = split(usable)
    fit_cases = [case for case in usable if case.recording in fit_names]
    held_cases = [case for case in usable if case.recording in held_names]
    rule = EndOfTurnRule() if args.shipped else fit(fit_cases)
    print(f"fit on {sorted(fit_names)}\nheld out {sorted(held_names)}")
    print(f"{'shipped' if args.shipped else 'fitted'} rule: {rule}")
    results = {"fit": report("fit recordings", fit_cases, rule), "held_out": report("held-out recordings",
                                                                                   held_cases, rule)}
    results["each_left_out"] = each_left_out(usable)
    for case in held_cases:
        if case.complete and rule.wait_ms(case.signals()) > rule.complete_ms:
            print(f"held-out complete utterance held: {case.recording} {case.transcript!r} "
                  f"(Smart Turn {case.audio_probability}, LM {case.text_probability})")
    text_ms = [case.text_ms for case in usable]
    print(f"\nfirst pass of an answer (its 1 token), CPU ms: median {statistics.median(text_ms):.1f}; the probe "
          "itself is one softmax row inside it (see tests/unit/test_end_of_turn_probe.py)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"fit_recordings": sorted(fit_names), "held_out_recordings": sorted(held_names),
                   "rule": asdict(rule), "results": results, "cases": [asdict(case) for case in cases]}
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
