"""Where a long turn's Whisper buffer may be cut: only between whole committed words (no model needed)."""

from __future__ import annotations

from voice.listen.local_agreement import Word
from voice.listen.transcriber import whole_word_boundaries


def words(*spec: tuple[str, float, float]) -> list[Word]:
    return [Word(text, start, end) for text, start, end in spec]


def test_cuts_fall_after_committed_words_that_a_new_word_follows() -> None:
    committed = words((" He", 0.0, 0.2), (" was", 0.2, 0.5), (" cold", 0.5, 0.9))
    tentative = words((" and", 0.9, 1.1))
    assert whole_word_boundaries(committed, tentative) == [0.2, 0.5, 0.9]


def test_no_cut_inside_a_word_whisper_split_in_pieces() -> None:
    committed = words((" rather", 0.0, 0.4), (" cold", 0.4, 0.8))
    assert whole_word_boundaries(committed, words(("-hearted", 0.8, 1.2))) == [0.4]  # not between cold|-hearted
    assert whole_word_boundaries(words((" old", 0.0, 0.3), ("-sposed", 0.3, 0.7)), []) == [0.7]


def test_the_committed_end_is_a_cut_when_nothing_tentative_follows() -> None:
    assert whole_word_boundaries(words((" yes", 0.0, 0.3)), []) == [0.3]
