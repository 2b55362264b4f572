from __future__ import annotations

from scripts.report_lib.answer_quality import has_ngram_loop, non_words, repeated_ngram_rate


def test_the_decayed_answer_of_issue_21_is_caught() -> None:
    answer = "That'm sorry, that're sorry. I'm sorry."
    assert non_words(answer) == ["that'm", "that're"]


def test_english_contractions_pass() -> None:
    text = "I'm sure you're right: it's fine, they'll come, we've won, don't worry, it wouldn't hurt, I'd go. Bob's."
    assert non_words(text) == []
    assert non_words("I\u2019m here") == []


def test_repeated_trigram_rate_and_loop() -> None:
    assert repeated_ngram_rate("the cat sat on the mat") == 0.0
    assert not has_ngram_loop("the cat sat on the mat")
    looping = "I am sorry, I am sorry, I am sorry"  # 9 words, 7 trigrams, 3 distinct
    assert repeated_ngram_rate(looping) == 4 / 7
    assert has_ngram_loop(looping)
    assert repeated_ngram_rate("too short") == 0.0
