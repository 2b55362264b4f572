"""The fit of the end-of-turn rule (voice/end_of_turn.py's `EndOfTurnRule`) on labelled pauses: the session only
applies the rule, so the fitting lives beside the script that runs it (scripts/train/fit_end_of_turn.py)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import numpy as np

from voice.end_of_turn import EndOfTurnRule, Signals, logit


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
    # each case with both signals: (audio log-odds, text log-odds, trails off, complete, recording)
    rows = [(logit(s.audio), logit(s.text), s.trails_off, c, g)
            for s, c, g in zip(signals, complete, groups or [str(i) for i in range(len(signals))], strict=True)
            if s.audio is not None and s.text is not None]
    done = np.array([c for _, _, _, c, _ in rows], dtype=bool)
    names = [g for _, _, _, _, g in rows]
    if len({g for g, c in zip(names, done, strict=True) if c}) < 3:
        raise ValueError("the fit needs complete utterances from at least three recordings")
    audio = np.array([a for a, _, _, _, _ in rows])
    text = np.array([t for _, t, _, _, _ in rows])
    trails = np.array([off for _, _, off, _, _ in rows], dtype=bool)
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
