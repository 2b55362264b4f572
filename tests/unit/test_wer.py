"""The word normalisation of the pipeline (voice.listen.words) and the word error rate built on it (report_lib.wer)."""

from __future__ import annotations

import pytest

from scripts.report_lib.wer import edit_distance, word_error_rate
from voice.listen.words import normalize_words, same_words


def test_normalisation_ignores_case_punctuation_and_hyphens():
    assert normalize_words("Mr. John, ill-disposed!") == ["mister", "john", "ill", "disposed"]
    assert normalize_words("'Tis café_au_lait — 42") == ["tis", "café", "au", "lait", "42"]
    assert same_words("Hello, World!", "hello world") and not same_words("hello world", "hello word")


def test_edit_distance_counts_substitutions_insertions_deletions():
    assert edit_distance(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    assert edit_distance([], ["a"]) == 1


def test_corpus_wer_weights_by_reference_length():
    assert word_error_rate([("he was not", "he was"), ("a b c d e f g", "a b c d e f g")]) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        word_error_rate([("", "anything")])
