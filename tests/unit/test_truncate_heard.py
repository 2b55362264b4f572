"""History as heard after the fact: a client that says where it stopped playing an ended answer (the Realtime API's
conversation.item.truncate) cuts the history's last assistant message to the phrases those samples held."""

from __future__ import annotations

from voice.speak.playback_ledger import PlaybackLedger
from voice.think.dialogue import Dialogue
from voice.turn.answer import Answer, AnswerGate
from voice.turn.record import TurnRecord
from voice.turn.records import TurnRecords


def test_played_until_corrects_an_estimate_down() -> None:
    ledger = PlaybackLedger()
    for pid, text in enumerate(["One.", "Two."]):
        ledger.begin_phrase(pid, text)
        ledger.add_audio(pid, 1000)
        ledger.end_phrase(pid)
    ledger.played_total(2000)
    assert ledger.spoken_text() == "One. Two."
    ledger.played_until(1000)
    assert ledger.spoken_text() == "One."
    ledger.played_until(0)
    assert ledger.spoken_text() == ""


def test_dialogue_replaces_only_an_assistant_message() -> None:
    dialogue = Dialogue()
    dialogue.add_user("hi")
    assert not dialogue.replace_last_assistant("x")
    dialogue.add_assistant("Hello there. How are you?")
    assert dialogue.replace_last_assistant("Hello there.")
    assert dialogue.history[-1].content == "Hello there."
    assert dialogue.replace_last_assistant("")
    assert [m.role for m in dialogue.history] == ["user"]


def _answered(records: TurnRecords, turn: int) -> Answer:
    record = TurnRecord(turn)
    record.user_text = f"question {turn}"
    answer = Answer(answer_id=turn, record=record, gate=AnswerGate(held=False), early=False)
    answer.text = "One. Two."
    for pid, text in enumerate(["One.", "Two."]):
        answer.playback.ledger.begin_phrase(pid, text)
        answer.playback.ledger.add_audio(pid, 1000)
        answer.playback.ledger.end_phrase(pid)
    records.end(record, answer, interrupted=False, stats={})
    return answer


def test_records_truncate_the_newest_ended_answer_only() -> None:
    dialogue = Dialogue()
    records = TurnRecords("s", dialogue)
    _answered(records, 1)
    assert dialogue.history[-1].content == "One. Two."
    assert records.truncate(1, 1000) == "One."
    assert dialogue.history[-1].content == "One."
    _answered(records, 2)
    assert records.truncate(1, 0) is None  # turn 1's message is no longer the newest
    assert records.truncate(2, 0) == ""
    assert [m.content for m in dialogue.history] == ["question 1", "One.", "question 2"]


def test_truncating_an_answer_that_left_no_message_adds_what_was_heard() -> None:
    dialogue = Dialogue()
    records = TurnRecords("s", dialogue)
    answer = _answered(records, 1)
    assert records.truncate(1, 0) == ""
    assert [m.role for m in dialogue.history] == ["user"]
    assert records.truncate(1, 1000) == "One." and dialogue.history[-1].content == "One."
    assert answer.playback.ledger.spoken_text() == "One."
