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
chosen by hand: they are fitted on the turn-detector benchmark's decodes (scripts/train/fit_end_of_turn.py, which
also reports them on recordings the fit did not use; the fit itself is scripts/train/end_of_turn_fit.py), and the
defaults below are that fit's output. The threshold is set for the utterances the fit has not heard: a bound that most
complete utterances clear, not the edge of the ones it saw.

Without the LM's probability (a remote model that gives no logprobs, a turn too long for the probe) the rule is Smart
Turn's verdict alone, as before; without either, the silence rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

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
