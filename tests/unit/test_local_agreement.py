"""LocalAgreement-2 commit policy over word hypotheses (no model)."""

from __future__ import annotations

from voice.listen.local_agreement import LocalAgreement, Word, common_prefix_length, join_words


def words(text: str, start: float = 0.0, step: float = 0.4) -> list[Word]:
    return [Word(" " + token, start + i * step, start + i * step + 0.3) for i, token in enumerate(text.split())]


def test_commits_only_what_two_consecutive_hypotheses_agree_on():
    agreement = LocalAgreement()
    assert agreement.update(words("the cat")) == []  # nothing to agree with yet
    newly = agreement.update(words("the cat sat on"))
    assert join_words(newly) == "the cat"
    assert join_words(agreement.tentative) == "sat on"
    newly = agreement.update(words("the cat sat in the"))
    assert join_words(newly) == "sat"
    assert join_words(agreement.committed) == "the cat sat"


def test_disagreement_commits_nothing_and_committed_never_changes():
    agreement = LocalAgreement()
    agreement.update(words("he was"))
    agreement.update(words("he was not"))
    assert join_words(agreement.committed) == "he was"
    agreement.update(words("we saw nothing"))  # a wild re-decode cannot retract committed words
    assert join_words(agreement.committed) == "he was"
    assert agreement.update(words("something else entirely")) == []


def test_case_and_punctuation_do_not_block_agreement():
    agreement = LocalAgreement()
    agreement.update([Word(" Hello", 0.0, 0.3), Word(" world...", 0.4, 0.7)])
    newly = agreement.update([Word(" hello,", 0.0, 0.3), Word(" world", 0.4, 0.7), Word(" again", 0.8, 1.0)])
    assert [w.key for w in newly] == ["hello", "world"]
    assert common_prefix_length(words("a b c"), words("a b d")) == 2
    # the same normalisation as the session and the WER: hyphens and abbreviations too
    assert Word(" Ill-disposed,", 0.0, 0.3).key == Word(" ill disposed", 0.0, 0.3).key == "ill disposed"
    assert Word(" Mr.", 0.0, 0.3).key == Word(" mister", 0.0, 0.3).key


def test_hypothesis_of_a_trimmed_buffer_skips_words_already_committed():
    agreement = LocalAgreement()
    agreement.update(words("one two three"))
    agreement.update(words("one two three four"))
    assert join_words(agreement.committed) == "one two three"
    # timestamps jitter by 0.05 s; the committed words reappear and must not be committed twice
    again = [Word(w.text, w.start + 0.05, w.end + 0.05) for w in words("one two three four five")]
    agreement.update(again)
    assert join_words(agreement.committed) == "one two three four"
    # a buffer trimmed after "two" only holds the later words
    agreement.update(words("three four five six", start=0.8))
    assert join_words(agreement.committed) == "one two three four five"


def test_flush_commits_the_rest():
    agreement = LocalAgreement()
    agreement.update(words("good morning"))
    agreement.update(words("good morning to you"))
    rest = agreement.flush()
    assert join_words(rest) == "to you"
    assert join_words(agreement.committed) == "good morning to you"
    assert agreement.tentative == []


def test_a_repeated_two_to_five_gram_at_the_boundary_is_the_same_words_heard_again() -> None:
    from voice.listen.local_agreement import LocalAgreement, Word

    agreement = LocalAgreement()
    agreement.committed = [Word(" the", 0.0, 0.2), Word(" conference", 0.2, 0.8), Word(" pin", 0.8, 1.0)]
    hypothesis = [Word(" conference", 0.85, 1.2), Word(" pin", 1.2, 1.4), Word(" number", 1.4, 1.8)]
    assert [w.text for w in agreement.fresh_words(hypothesis)] == [" number"]


def test_a_word_said_twice_long_after_the_boundary_is_kept() -> None:
    from voice.listen.local_agreement import LocalAgreement, Word

    agreement = LocalAgreement()
    agreement.committed = [Word(" yes", 0.0, 0.3)]
    assert [w.text for w in agreement.fresh_words([Word(" yes", 2.0, 2.3)])] == [" yes"]
