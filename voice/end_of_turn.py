"""How long a paused turn waits before its answer is released: one decision from everything the session knows. No I/O.

Four things are known when the user pauses. Smart Turn v3.2's ear: the probability that the audio sounds finished.
The LM's words: the probability that the message ends right after the transcript's last word (the end-of-message
token or a sentence-ending mark), read from the answer's first pass (model/decoding/end_of_turn.py; `LmTurnVerdict`
in voice/turn/machine.py). And two word rules: Whisper wrote a finished question (`asks_a_question`), or the words
trail off (`trails_off`).

Alone, Smart Turn heard a quarter of finished utterances as unfinished, and each then waited 1.5 s; the LM reads the
words, which tell "After the meeting, remind me to send the report to Sarah." from "After the meeting," better than
the prosody does. The two are combined as a logistic regression on their log-odds,

    score = sigmoid(bias + audio_weight * logit(P_audio) + text_weight * logit(P_text))

and the turn is released after the short wait when the score passes `threshold`; otherwise it waits the long one (the
question's shorter one when Whisper wrote a question). A transcript that trails off waits the long one whatever the
score when `trails_off_holds`. Weights, threshold and whether the trailing-off rule still earns its place are not
chosen by hand: `fit_rule` fits them on the turn-detector benchmark's decodes (scripts/train/fit_end_of_turn.py, which
also reports them on recordings the fit did not use), and the defaults below are that fit's output.

Without the LM's probability (a remote model that gives no logprobs, a turn too long for the probe) the rule is Smart
Turn's verdict alone, as before; without either, the silence rule.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

EPSILON = 1e-4  # probabilities are clipped to [EPSILON, 1 - EPSILON]: a bare verdict (no probability) is a sure one


class Signals(NamedTuple):
    """What is known about a paused turn. `audio`: Smart Turn's probability that it sounds complete (None: no verdict
    yet, or no detector); `text`: the LM's P(end of message) after the last word (None: not computed)."""

    audio: float | None
    text: float | None
    question: bool = False
    trails_off: bool = False


def logit(probability: float) -> float:
    p = min(max(probability, EPSILON), 1.0 - EPSILON)
    return math.log(p / (1.0 - p))


@dataclass(frozen=True, slots=True)
class EndOfTurnRule:
    """The fitted combination (see the module docstring) and the waits it chooses between, in milliseconds."""

    # fitted by scripts/train/fit_end_of_turn.py on the fit half of the turn-detector benchmark's recordings
    bias: float = 1.7707
    audio_weight: float = 0.1893
    text_weight: float = 1.0109
    threshold: float = 0.1833
    trails_off_holds: bool = True
    audio_threshold: float = 0.5  # Smart Turn alone: its own decision threshold
    complete_ms: float = 200.0
    incomplete_ms: float = 1500.0
    question_ms: float = 800.0
    silence_rule_ms: float = 600.0

    def score(self, signals: Signals) -> float | None:
        """The combined probability that the turn is complete; None unless both signals are known."""
        if signals.audio is None or signals.text is None:
            return None
        z = self.bias + self.audio_weight * logit(signals.audio) + self.text_weight * logit(signals.text)
        return 1.0 / (1.0 + math.exp(-z))

    def complete(self, signals: Signals) -> bool | None:
        """Whether the turn is judged complete (None: nothing to judge by yet: the silence rule applies)."""
        if signals.trails_off and self.trails_off_holds:
            return False
        score = self.score(signals)
        if score is not None:
            return score > self.threshold
        if signals.audio is None:
            return None
        return signals.audio > self.audio_threshold

    def wait_ms(self, signals: Signals) -> float:
        """Silence after the last word before the held answer is released."""
        complete = self.complete(signals)
        if complete is None:
            return self.silence_rule_ms
        if complete:
            return self.complete_ms
        if signals.question and not signals.trails_off:
            return min(self.question_ms, self.incomplete_ms)
        return self.incomplete_ms


def _logistic_fit(features: np.ndarray, labels: np.ndarray, l2: float = 1e-2) -> np.ndarray:
    """Weights `[bias, w...]` of a logistic regression by Newton's method, with a small ridge so that separable data
    (a few dozen cases) still gives finite weights."""
    x = np.hstack([np.ones((features.shape[0], 1)), features])
    w = np.zeros(x.shape[1])
    ridge = l2 * np.eye(x.shape[1])
    ridge[0, 0] = 0.0  # the bias is not shrunk
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        gradient = x.T @ (p - labels) + ridge @ w
        hessian = (x * (p * (1 - p))[:, None]).T @ x + ridge
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return w


def _objective(rule: EndOfTurnRule, signals: list[Signals], complete: list[bool], floor: float) -> tuple[bool, float]:
    """(complete utterances released on at least `floor` of them, share of cuts held)."""
    released = [rule.complete(s) is True for s in signals]
    done = [r for r, c in zip(released, complete, strict=True) if c]
    cuts = [not r for r, c in zip(released, complete, strict=True) if not c]
    return (sum(done) >= floor * len(done), sum(cuts) / max(len(cuts), 1))


def fit_rule(signals: list[Signals], complete: list[bool], floor: float = 0.95,
             base: EndOfTurnRule | None = None) -> EndOfTurnRule:
    """Fit the combination on labelled cases (complete utterance or cut): the logistic weights on both signals'
    log-odds, then, for the trailing-off rule on and off, the threshold that holds the most cuts while releasing at
    least `floor` of the complete utterances, placed halfway (in log-odds) between the scores that bound it so that a
    case just past the fit's edge falls on the side the fit saw. Ties keep the trailing-off rule."""
    base = base or EndOfTurnRule()
    usable = [(s, c) for s, c in zip(signals, complete, strict=True) if s.audio is not None and s.text is not None]
    features = np.array([[logit(s.audio), logit(s.text)] for s, _ in usable])  # type: ignore[arg-type]
    labels = np.array([1.0 if c else 0.0 for _, c in usable])
    bias, audio_weight, text_weight = (float(v) for v in _logistic_fit(features, labels))
    weighted = EndOfTurnRule(bias, audio_weight, text_weight, 0.5, base.trails_off_holds, base.audio_threshold,
                             base.complete_ms, base.incomplete_ms, base.question_ms, base.silence_rule_ms)
    scores = sorted({weighted.score(s) or 0.0 for s, _ in usable})
    # candidate thresholds: halfway in log-odds between neighbouring scores, and below the lowest
    candidates = [1.0 / (1.0 + math.exp(-(logit(a) + logit(b)) / 2)) for a, b in itertools.pairwise(scores)]
    candidates = [scores[0] / 2, *candidates]
    best: tuple[tuple[bool, float, bool, float], EndOfTurnRule] | None = None
    for holds in (True, False):
        for threshold in candidates:
            rule = EndOfTurnRule(bias, audio_weight, text_weight, threshold, holds, base.audio_threshold,
                                 base.complete_ms, base.incomplete_ms, base.question_ms, base.silence_rule_ms)
            meets, held = _objective(rule, [s for s, _ in usable], [c for _, c in usable], floor)
            # the floor first, then cuts held, then the trailing-off rule kept, then the threshold nearest 0.5
            key = (meets, held, holds, -abs(logit(threshold)))
            if best is None or key > best[0]:
                best = (key, rule)
    assert best is not None
    rule = best[1]
    return EndOfTurnRule(round(rule.bias, 4), round(rule.audio_weight, 4), round(rule.text_weight, 4),
                         round(rule.threshold, 4), rule.trails_off_holds, rule.audio_threshold, rule.complete_ms,
                         rule.incomplete_ms, rule.question_ms, rule.silence_rule_ms)
