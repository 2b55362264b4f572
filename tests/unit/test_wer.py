"""Word error rate used by the ASR tests and benchmark."""

from __future__ import annotations

import pytest
from report_lib.wer import edit_distance, normalize_words, word_error_rate


def test_normalisation_ignores_case_punctuation_and_hyphens():
    assert normalize_words("Mr. John, ill-disposed!") == ["mister", "john", "ill", "disposed"]


def test_edit_distance_counts_substitutions_insertions_deletions():
    assert edit_distance(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    assert edit_distance([], ["a"]) == 1


def test_corpus_wer_weights_by_reference_length():
    assert word_error_rate([("he was not", "he was"), ("a b c d e f g", "a b c d e f g")]) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        word_error_rate([("", "anything")])
