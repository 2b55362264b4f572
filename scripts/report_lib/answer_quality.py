"""How an answer reads, without a model: repeated word n-grams, 3-word loops and contractions that are not English.

No I/O, unit-tested. The soak and the dialogue benchmark compute these per turn, so a conversation whose answers decay
("That'm sorry, that're sorry. I'm sorry.") shows it by turn index.
"""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# The subjects each contraction can follow in English; "'s", "'d" and "n't" are left to a short list of known forms.
_CONTRACTION_SUBJECTS = {
    "m": {"i"},
    "re": {"you", "we", "they", "who", "what", "there", "here", "where", "how", "why", "when", "these", "those"},
    "ve": {"i", "you", "we", "they", "who", "what", "would", "could", "should", "might", "must", "there"},
    "ll": {"i", "you", "we", "they", "he", "she", "it", "that", "there", "who", "what", "this", "where"},
}
_NT_WORDS = {
    "don't", "doesn't", "didn't", "can't", "couldn't", "won't", "wouldn't", "isn't", "aren't", "wasn't", "weren't",
    "haven't", "hasn't", "hadn't", "shouldn't", "mustn't", "mightn't", "needn't", "ain't", "shan't",
}  # fmt: skip


def words(text: str) -> list[str]:
    """Lower-case words of `text`, apostrophes inside a word kept (typographic ones normalised)."""
    return _WORD.findall(text.lower().replace("\u2019", "'"))


def repeated_ngram_rate(text: str, n: int = 3) -> float:
    """Share of the answer's word n-grams that already occurred earlier in the same answer (0.0 for no repeats)."""
    tokens = words(text)
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    repeats = sum(count - 1 for count in Counter(grams).values())
    return repeats / len(grams)


def has_ngram_loop(text: str, n: int = 3) -> bool:
    """True when some n-gram of words occurs twice or more in the answer (a "that's sorry, that's sorry" loop)."""
    tokens = words(text)
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) < len(grams)


def non_words(text: str) -> list[str]:
    """Contractions that English does not have ("that'm", "that're"); the words are returned as written."""
    bad = []
    for word in words(text):
        if "'" not in word:
            continue
        stem, suffix = word.split("'", 1)
        if suffix == "t":
            ok = word in _NT_WORDS
        elif suffix in _CONTRACTION_SUBJECTS:
            ok = stem in _CONTRACTION_SUBJECTS[suffix]
        else:
            ok = suffix in {"s", "d"}  # possessive or is/has/had/would: any noun can take them
        if not ok:
            bad.append(word)
    return bad
