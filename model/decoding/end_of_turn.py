"""The LM's own sense that the user has finished: P(the message ends) right after the user's last word.

A text end-of-utterance model (LiveKit's turn detector) judges the words, not the audio: how likely a language model
is to close the user's message after them. The answer's LM already reads exactly these words. Its first pass encodes
the turn's new words as clean rows (the prompt's uncached part, folded into that pass:
model/runtime/batch_runner.py), and every clean row's logits come back from that pass anyway, so the probability
costs a softmax over one row: no extra forward. When the new words are too many to fold, the runner's prefill stops
after the last word and encodes the rest separately (one small forward), so the prediction there is the prefill's
own output.

The row is the last *word*, before any punctuation Whisper put after it, and the probability is that of what ends a
message there: the end-of-message token itself or a sentence-ending mark ("." "?" "!"), summed. Whisper's final
punctuation is its own guess from the same audio (it writes "when you get a chance." for a cut at a comma), and after
it the 135M LM's P(`<|im_end|>`) is small and overlapping (held-out AUC 0.78 on the turn-detector benchmark's cases);
whether the sentence may end after the words themselves separates finished from unfinished far better (0.97 alone,
scripts/train/fit_end_of_turn.py).

`EndOfTurnProbe` wraps any decoding sequence (self-speculative, autoregressive, diffusion): it finds the row, reads
the probability on the first pass and stamps it on that pass's `Refinement` (`end_of_turn`). A prompt that does not
end with the chat template's user-message tail (a raw prompt, a model without a template) gets no probe: absent,
never guessed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import torch

from model.decoding.refinement import Refinement
from model.decoding.step import Feed, FoldingSequence, ReadsTaps, TimesItsPasses


def message_tail(with_words: Sequence[int], words: Sequence[int]) -> tuple[int, ...] | None:
    """The tokens a chat template puts after a user message's words up to the answer (`<|im_end|>` and the assistant
    header), found by formatting a chat whose last user message is `words`: None when `words` are not there."""
    for start in range(len(with_words) - len(words), -1, -1):
        if list(with_words[start : start + len(words)]) == list(words):
            return tuple(with_words[start + len(words) :])
    return None


def probe_row(prompt: Sequence[int], tail: Sequence[int], punctuation: Collection[int] = ()) -> int | None:
    """Index in `prompt` of the user's last word (the row whose logits predict what follows it): the last token
    before the template's `tail` that is not in `punctuation` (the marks Whisper may have written after the word).
    None when the prompt does not end with `tail` after at least one token."""
    if not tail or len(prompt) <= len(tail) or tuple(prompt[-len(tail) :]) != tuple(tail):
        return None
    row = len(prompt) - len(tail) - 1
    while row > 0 and prompt[row] in punctuation:
        row -= 1
    return row


def end_probability(logits: torch.Tensor, end_ids: Sequence[int]) -> float:
    """Softmax probability of any of `end_ids` in one row of logits `[V]`: two logsumexps, no softmax over the row."""
    row = logits.float()
    return float(torch.exp(torch.logsumexp(row[list(end_ids)], dim=-1) - torch.logsumexp(row, dim=-1)))


class EndOfTurnProbe:
    """A decoding sequence (`model.decoding.step.DecodingSequence`) whose first pass also reports the
    probability that the message ends after the user's last word (prompt index `row`): that of any of `end_ids`,
    the end-of-message token and the sentence-ending marks. It reads that row (`model.decoding.step.ReadsPromptRow`)
    from the first pass's folded rows, or from the prefill that stops right after it."""

    def __init__(self, inner: FoldingSequence, prompt: Sequence[int], row: int, end_ids: Sequence[int]) -> None:
        self.inner = inner
        self.row = row
        self.end_ids = tuple(end_ids)
        self._prompt_length = len(prompt)
        self._lead = 0  # prompt tokens before the last one that the first pass encodes (folded)
        self.probability: float | None = None  # known after the prefill or the first pass
        self._stamped = False

    @property
    def cached_prompt(self) -> list[int]:
        return self.inner.cached_prompt

    def fold_prompt(self, tokens: Sequence[int]) -> None:
        """The first pass encodes `tokens` ahead of the prompt's last token; the probe's row may be one of them."""
        self._lead = len(tokens)
        self.inner.fold_prompt(tokens)

    def prefilled(self, logits: torch.Tensor) -> None:
        """The prefill up to the user's last word (the runner stops it there when nothing is folded) predicted
        `logits` `[V]` for the token after it."""
        self.probability = end_probability(logits, self.end_ids)

    def feed(self, crowd: int = 1) -> Feed:
        return self.inner.feed(crowd)

    def take_taps(self, tapped: torch.Tensor) -> None:
        if isinstance(self.inner, ReadsTaps):
            self.inner.take_taps(tapped)

    def untimed(self) -> None:
        if isinstance(self.inner, TimesItsPasses):
            self.inner.untimed()

    def consume(
        self, clean_logits: torch.Tensor, noisy_logits: torch.Tensor, elapsed_s: float, cancelled: bool = False
    ) -> tuple[Refinement, int]:
        if not self._stamped and self._lead:
            # the folded rows are prompt[len - 1 - lead : len - 1], the first rows of the pass
            index = self.row - (self._prompt_length - 1 - self._lead)
            if 0 <= index < self._lead:
                self.probability = end_probability(clean_logits[index], self.end_ids)
        refinement, kept = self.inner.consume(clean_logits, noisy_logits, elapsed_s, cancelled)
        if not self._stamped:
            self._stamped = True
            if self.probability is not None:
                refinement = dataclasses.replace(refinement, end_of_turn=self.probability)
        return refinement, kept
