"""When two transcripts say the same words: the one word normalisation of the pipeline, its tests and benchmarks.

Whisper's case, punctuation and hyphenation flip between decodes of the same audio ("Ill-disposed," vs "ill disposed"),
so LocalAgreement compares words by it, the session uses it to decide whether an early LM start answered the words
finally said, and the word error rate (scripts/report_lib/wer.py) scores transcripts by it.
"""

from __future__ import annotations

import re

_SPOKEN = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}
_SEPARATORS = re.compile(r"[-–—/]")
_NOT_WORD = re.compile(r"[^\w' ]+|_")


def normalize_words(text: str) -> list[str]:
    """Lower-case words without punctuation; hyphenated words split ("ill-disposed" -> "ill disposed"), a few
    abbreviations in their spoken form ("Mr." -> "mister")."""
    text = _NOT_WORD.sub(" ", _SEPARATORS.sub(" ", text.lower()))
    return [_SPOKEN.get(word, word) for word in (w.strip("'") for w in text.split()) if word]


def same_words(a: str, b: str) -> bool:
    """Whether two transcripts say the same words, whatever their case and punctuation."""
    return normalize_words(a) == normalize_words(b)
