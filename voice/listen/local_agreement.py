"""LocalAgreement-2: commit the words on which two consecutive hypotheses of a growing audio buffer agree. No I/O.

Whisper re-decodes the whole buffer each time audio grows, so its tail changes as more context arrives. A word is
committed (shown as final, never retracted) once two hypotheses in a row agree on it and on everything before it; this
is the policy of Machacek et al., "Turning Whisper into Real-Time Transcription System" (2023).

Words carry times in seconds from the start of the turn, so hypotheses of a trimmed buffer (which start later) line up
with earlier ones: words the committed prefix already covers are dropped before comparing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from voice.listen.words import normalize_words

MAX_REPEATED_NGRAM = 5
REPEAT_WINDOW_S = 1.0  # a repeat counts only if it starts this close to the committed end


@dataclass(frozen=True, slots=True)
class Word:
    """One recognised word; `text` keeps Whisper's spacing and punctuation, `start`/`end` are seconds in the turn."""

    text: str
    start: float
    end: float

    @property
    def key(self) -> str:
        """What agreement compares: case and punctuation often flip between hypotheses without changing the word."""
        return " ".join(normalize_words(self.text))


def join_words(words: Sequence[Word]) -> str:
    """Whisper's word texts carry their own leading spaces; join and tidy them."""
    return "".join(word.text for word in words).strip()


def common_prefix_length(a: Sequence[Word], b: Sequence[Word]) -> int:
    """How many leading words `a` and `b` share (by `Word.key`)."""
    length = 0
    for left, right in zip(a, b, strict=False):
        if left.key != right.key:
            break
        length += 1
    return length


class LocalAgreement:
    """Feed each new hypothesis with `update`; read `committed` and `tentative`; `flush` at end of turn."""

    def __init__(self, overlap_tolerance_s: float = 0.1) -> None:
        self.overlap_tolerance_s = overlap_tolerance_s
        self.committed: list[Word] = []
        self.tentative: list[Word] = []

    @property
    def committed_end(self) -> float:
        """End time of the last committed word (0.0 before any commit)."""
        return self.committed[-1].end if self.committed else 0.0

    def fresh_words(self, hypothesis: Sequence[Word]) -> list[Word]:
        """The part of a hypothesis after the committed prefix: words whose middle lies past the committed end.

        Using the middle, not the start, tolerates the ~0.1 s jitter of Whisper's word timestamps between decodes.
        """
        if not self.committed:
            return list(hypothesis)
        boundary = self.committed_end - self.overlap_tolerance_s
        fresh = [word for word in hypothesis if (word.start + word.end) / 2 > boundary]
        # The last committed words heard again right at the boundary (timestamps jitter, a trimmed buffer re-hears
        # its start) are the same words, not new ones: drop the longest such 1- to 5-gram, as whisper_streaming does.
        if fresh and abs(fresh[0].start - self.committed_end) < REPEAT_WINDOW_S:
            for n in range(min(MAX_REPEATED_NGRAM, len(self.committed), len(fresh)), 0, -1):
                if [w.key for w in self.committed[-n:]] == [w.key for w in fresh[:n]]:
                    return fresh[n:]
        return fresh

    def update(self, hypothesis: Sequence[Word]) -> list[Word]:
        """Take the next hypothesis of the buffer; commit and return the words it agrees on with the previous one."""
        fresh = self.fresh_words(hypothesis)
        agreed = common_prefix_length(self.tentative, fresh)
        newly_committed = fresh[:agreed]
        self.committed.extend(newly_committed)
        self.tentative = fresh[agreed:]
        return newly_committed

    def flush(self, hypothesis: Sequence[Word] | None = None) -> list[Word]:
        """End of turn: commit the rest of `hypothesis` (or of the last one) unconditionally and return it."""
        rest = self.fresh_words(hypothesis) if hypothesis is not None else self.tentative
        self.committed.extend(rest)
        self.tentative = []
        return rest

    def reset(self) -> None:
        self.committed = []
        self.tentative = []
