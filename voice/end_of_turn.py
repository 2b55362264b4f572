"""How long a paused turn waits before its answer is released: one decision from everything the session knows. No I/O.

Four things are known when the user pauses. Smart Turn v3.2's ear: the probability that the audio sounds finished.
The LM's words: the probability that the message ends right after the transcript's last word (the end-of-message
token or a sentence-ending mark), read from the answer's first pass (model/decoding/end_of_turn.py; `LmTurnVerdict`
in voice/turn/machine.py). And two word rules: Whisper wrote a finished question (`asks_a_question`), or the words
trail off (`trails_off`).

Alone, Smart Turn heard a quarter of finished utterances as unfinished, and each then waited 1.5 s; the LM reads the
words, which tell "After the meeting, remind me to send the report to Sarah." from "After the meeting," better than
the prosody does. The two are combined on their log-odds,

    score = sigmoid(bias + audio_weight * logit(P_audio) + text_weight * logit(P_text))

and the turn is released after the short wait when the score passes `threshold`; otherwise it waits the long one (the
question's shorter one when Whisper wrote a question). A transcript that trails off waits the long one whatever the
score when `trails_off_holds`. Weights, threshold and whether the trailing-off rule still earns its place are not
chosen by hand: `fit_rule` fits them on the turn-detector benchmark's decodes (scripts/train/fit_end_of_turn.py, which
also reports them on recordings the fit did not use), and the defaults below are that fit's output. The threshold is
set for the utterances the fit has not heard: a bound that most complete utterances clear, not the edge of the ones it
saw (see `fit_rule`).

Without the LM's probability (a remote model that gives no logprobs, a turn too long for the probe) the rule is Smart
Turn's verdict alone, as before; without either, the silence rule.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
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
    bias: float = 2.0938
    audio_weight: float = 0.0813
    text_weight: float = 0.9297
    threshold: float = 0.1478
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


MIXES_DEGREES = tuple(range(0, 91, 5))  # candidate mixes of the two log-odds: 0 is the ear alone, 90 the words alone


def tolerance_factor(n: int, coverage: float, confidence: float) -> float:
    """k such that mean - k * sd of `n` normal samples lies below `coverage` of the population with probability
    `confidence` (one-sided normal tolerance bound; Natrella's approximation: for n of 10 or more, 0.5-2.5 % below
    the exact noncentral-t factor)."""
    z_p = statistics.NormalDist().inv_cdf(coverage)
    z_g = statistics.NormalDist().inv_cdf(confidence)
    a = 1.0 - z_g**2 / (2.0 * (n - 1))
    b = z_p**2 - z_g**2 / n
    return (z_p + math.sqrt(z_p**2 - a * b)) / a


def _bound(complete_scores: np.ndarray, floor: float, confidence: float) -> float:
    """The threshold below which at most 1 - `floor` of complete utterances like these fall, with `confidence`."""
    k = tolerance_factor(complete_scores.size, floor, confidence)
    return float(complete_scores.mean() - k * complete_scores.std(ddof=1))


def _left_out(scores: np.ndarray, complete: np.ndarray, releasable: np.ndarray, groups: list[str], floor: float,
              confidence: float) -> np.ndarray:
    """Whether each case is released by the threshold bounded on the other groups' complete utterances."""
    released = np.zeros_like(complete)
    for group in set(groups):
        inside = np.array([g == group for g in groups])
        threshold = _bound(scores[~inside & complete], floor, confidence)
        released[inside] = (scores[inside] > threshold) & releasable[inside]
    return released


def fit_rule(signals: list[Signals], complete: list[bool], groups: list[str] | None = None, floor: float = 0.95,
             confidence: float = 0.9, base: EndOfTurnRule | None = None) -> EndOfTurnRule:
    """Fit the combination on labelled cases (complete utterance, or a cut of one), `groups` naming each case's
    recording (None: every case its own).

    The rule must release at least `floor` of complete utterances it has never seen. A threshold at the edge of the
    complete utterances one has seen does not: fitted that way on half the turn-detector benchmark's recordings, it
    released all the fitted complete utterances and 87.5 % of the other half's. So the threshold is a one-sided
    tolerance bound: below it fall at most 1 - `floor` of complete utterances, with probability `confidence`,
    taking their scores as normal in the mixed log-odds (`tolerance_factor`; with a few dozen utterances it lies
    about two standard deviations below their mean).

    The mix of the two log-odds (`MIXES_DEGREES`) and whether the trailing-off rule holds are chosen on recordings
    left out: each recording's cases are judged by the bound fitted on the others, and the choice that releases
    `floor` of the left-out complete utterances and holds the most left-out cuts wins (ties: the trailing-off rule
    kept, then the middle of the tying mixes). A logistic regression on the chosen mix scales it so that `score`
    reads as a probability."""
    base = base or EndOfTurnRule()
    rows = [(s, c, g) for s, c, g in zip(signals, complete, groups or [str(i) for i in range(len(signals))],
                                         strict=True) if s.audio is not None and s.text is not None]
    done = np.array([c for _, c, _ in rows], dtype=bool)
    names = [g for _, _, g in rows]
    if len({g for g, c in zip(names, done, strict=True) if c}) < 3:
        raise ValueError("the fit needs complete utterances from at least three recordings")
    audio = np.array([logit(s.audio) for s, _, _ in rows])  # type: ignore[arg-type]
    text = np.array([logit(s.text) for s, _, _ in rows])  # type: ignore[arg-type]
    trails = np.array([s.trails_off for s, _, _ in rows], dtype=bool)
    judged: dict[tuple[bool, int], tuple[bool, int]] = {}
    mixes = {degrees: math.cos(math.radians(degrees)) * audio + math.sin(math.radians(degrees)) * text
             for degrees in MIXES_DEGREES}
    for holds in (True, False):
        releasable = ~trails if holds else np.ones_like(trails)
        for degrees, scores in mixes.items():
            released = _left_out(scores, done, releasable, names, floor, confidence)
            judged[(holds, degrees)] = (bool(released[done].mean() >= floor), int((~released[~done]).sum()))
    best = max((*outcome, holds) for (holds, _), outcome in judged.items())
    tying = sorted(degrees for (holds, degrees), outcome in judged.items() if (*outcome, holds) == best)
    holds, degrees = best[2], tying[len(tying) // 2]
    scores = mixes[degrees]
    bias, scale = (float(v) for v in _logistic_fit(scores[:, None], done.astype(float)))
    scale = max(scale, 1e-3)  # a mix the regression finds useless still orders the cases: keep the score increasing
    threshold = 1.0 / (1.0 + math.exp(-(bias + scale * _bound(scores[done], floor, confidence))))
    return replace(base, bias=round(bias, 4), audio_weight=round(scale * math.cos(math.radians(degrees)), 4),
                   text_weight=round(scale * math.sin(math.radians(degrees)), 4), threshold=round(threshold, 4),
                   trails_off_holds=holds)
