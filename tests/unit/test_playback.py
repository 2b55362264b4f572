"""The playback ledger: what the listener heard, for barge-in truncation."""

from __future__ import annotations

import pytest

from voice.speak.playback_ledger import PlaybackLedger


def ledger_with(phrases: list[tuple[str, int]]) -> PlaybackLedger:
    ledger = PlaybackLedger(heard_fraction=0.8)
    for phrase_id, (text, samples) in enumerate(phrases):
        ledger.begin_phrase(phrase_id, text)
        ledger.add_audio(phrase_id, samples)
        ledger.end_phrase(phrase_id)
    return ledger


def test_spoken_text_is_the_run_of_mostly_played_phrases() -> None:
    ledger = ledger_with([("Hello there.", 1000), ("How are you?", 1000), ("Bye.", 500)])
    assert ledger.spoken_text() == ""
    ledger.played(0, 1000)
    ledger.played(1, 790)  # below 80 %: not heard
    assert ledger.spoken_text() == "Hello there."
    ledger.played(1, 10)
    assert ledger.spoken_text() == "Hello there. How are you?"
    assert ledger.spoken_phrases() == (0, 1)


def test_a_later_phrase_cannot_be_heard_before_an_earlier_one() -> None:
    ledger = ledger_with([("One.", 100), ("Two.", 100)])
    ledger.played(1, 100)
    assert ledger.spoken_text() == ""


def test_played_total_spreads_over_phrases_in_order() -> None:
    ledger = ledger_with([("One.", 100), ("Two.", 100), ("Three.", 100)])
    ledger.played_total(190)
    assert [r.samples_played for r in ledger.snapshot()] == [100, 90, 0]
    assert ledger.spoken_text() == "One. Two."


def test_phrase_still_being_handed_out_is_not_spoken_and_silent_phrase_is() -> None:
    ledger = PlaybackLedger()
    ledger.begin_phrase(0, "🎉")
    ledger.end_phrase(0)  # normalised to nothing: no audio
    ledger.begin_phrase(1, "Long phrase")
    ledger.add_audio(1, 100)
    ledger.played(1, 100)
    assert ledger.spoken_text() == "🎉"  # phrase 1 may have more audio to come
    with pytest.raises(KeyError):
        ledger.played(7, 1)
