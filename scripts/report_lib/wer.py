"""Word error rate, for comparing streaming against offline transcripts (tests and the ASR benchmark).

Both sides go through the pipeline's word normalisation (`voice.listen.words`: case, punctuation, hyphens, a few
spoken forms of abbreviations), so a difference in WER is a difference in words, not in Whisper's punctuation.
"""

from __future__ import annotations

from collections.abc import Iterable

from voice.listen.words import normalize_words


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance over words (substitutions, insertions, deletions all cost 1)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, start=1):
        current = [i]
        for j, hyp_word in enumerate(hypothesis, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word)))
        previous = current
    return previous[-1]


def word_error_rate(pairs: Iterable[tuple[str, str]]) -> float:
    """Corpus WER of (reference, hypothesis) pairs: total word edits over total reference words."""
    edits = words = 0
    for reference, hypothesis in pairs:
        ref = normalize_words(reference)
        edits += edit_distance(ref, normalize_words(hypothesis))
        words += len(ref)
    if words == 0:
        raise ValueError("WER needs at least one reference word")
    return edits / words
