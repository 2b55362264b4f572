"""When two transcripts say the same words, and when one trails off: the word rules of the pipeline.

Whisper's case, punctuation and hyphenation flip between decodes of the same audio ("Ill-disposed," vs "ill disposed"),
so LocalAgreement compares words by it, the turn-taking core uses it to decide whether a speculative answer answered
the words finally said, and the word error rate (scripts/report_lib/wer.py) scores transcripts by it.
"""

from __future__ import annotations

import re

_SPOKEN = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}
# Words that lean on the next one: a sentence does not end on them. A phrase cut after one is spoken with a final fall
# where the sentence goes on (voice/speak/speculator.py), and a transcript ending on one was cut off mid-thought.
LEANING_WORDS = frozenset(
    (
        "a", "an", "the", "of", "to", "in", "on", "at", "for", "with", "by", "from", "about", "into", "as", "and", "or",
        "but", "if", "than", "because", "is", "are", "was", "were", "be", "been", "am", "i", "i'm", "we", "they",
        "he", "she", "it's", "my", "your", "our", "their", "its", "can", "could", "will", "would", "should", "do",
        "does", "did", "have", "has", "had", "very", "what", "how",
    )
)  # not words that end sentences as well ("I love it", "thank you", "I think so", "why not", "over there")
_TRAILING_OFF = ("...", "…", "-", "–", "—")
_CLOSING_QUOTES = "\"')”’"
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


def ends_leaning(text: str) -> bool:
    """Whether the last word of `text` leans on the next one (`LEANING_WORDS`), whatever its case, quotes or
    apostrophe ("“The", "it’s")."""
    words = normalize_words(text.replace("\u2019", "'"))
    return bool(words) and words[-1] in LEANING_WORDS


def trails_off(text: str) -> bool:
    """Whether a transcript stops mid-thought: Whisper wrote it trailing off ("My brother and I...", "on the-"), or it
    ends on a word that leans on the next one without a sentence end ("should I take the"). On the turn detector
    benchmark's recordings this marked 5 of the 28 cuts Smart Turn heard as complete, and none of the 23 complete
    utterances."""
    stripped = text.strip().rstrip(_CLOSING_QUOTES)
    if not stripped:
        return False
    if stripped.endswith(_TRAILING_OFF):
        return True
    return stripped[-1] not in ".?!,;:" and ends_leaning(stripped)


def asks_a_question(text: str) -> bool:
    """Whether Whisper wrote the transcript as a finished question of three words or more ("Can you recommend a good
    book?"). Whisper puts the question mark from the words and their intonation, which Smart Turn, hearing the audio
    alone, misses: in the latency report it held 4 of 30 complete questions as unfinished. On the turn detector
    benchmark's decodes 11 of 84 ended this way; Smart Turn called 4 of them unfinished: one complete question, one
    cut that is a question in itself, and two cuts ("So what?", "is the museum open up?"), of which the three-word
    floor keeps out the first."""
    stripped = text.strip().rstrip(_CLOSING_QUOTES)
    question = stripped.endswith("?") and not stripped.rstrip("?").endswith(_TRAILING_OFF)  # not "tell me...?"
    return question and len(normalize_words(stripped)) >= 3
