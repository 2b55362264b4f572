"""The parts of the session shell on their own, without a session: an answer's pause accounting and playback
position, the turn records ending a turn into the history, and the clock that ticks only while the core needs it."""

from __future__ import annotations

import asyncio

from voice.think.dialogue import Dialogue
from voice.turn.answer import Answer, AnswerGate
from voice.turn.clock import TurnClock
from voice.turn.machine_events import ClockTick, State, TurnEvent
from voice.turn.records import TurnRecord, TurnRecords


def two_phrase_answer() -> Answer:
    record = TurnRecord(turn=3, user_text="Tell me a story.")
    answer = Answer(answer_id=1, record=record, gate=AnswerGate(held=False), early=False)
    for phrase_id, text in enumerate(["Once upon a time.", "The end."]):
        answer.playback.ledger.begin_phrase(phrase_id, text)
        answer.playback.ledger.add_audio(phrase_id, 1000)
        answer.playback.ledger.end_phrase(phrase_id)
    answer.text = "Once upon a time. The end."
    answer.playback.sample_rate = 1000
    return answer


def test_pauses_are_counted_once_and_their_time_is_not_playback() -> None:
    answer = two_phrase_answer()
    assert answer.playback.pause(t_ns=1_000) and not answer.playback.pause(t_ns=2_000)  # a second pause is no new pause
    assert not answer.playback.unpaused.is_set() and answer.playback.pauses == 1
    assert answer.playback.paused_ns_until(5_000) == 4_000
    assert answer.playback.resume(t_ns=6_000) and not answer.playback.resume(t_ns=7_000)
    assert answer.playback.unpaused.is_set() and answer.playback.paused_ns_until(9_000) == 5_000


def test_the_outputs_report_of_what_played_beats_the_estimate() -> None:
    answer = two_phrase_answer()
    assert answer.playback.played_estimate() == 0 and answer.playback.playback_left() == 0.0  # no audio went out yet
    answer.playback.reported_played = 1500
    assert answer.playback.played_estimate() == 1500
    answer.playback.first_audio_ns = 1
    assert answer.playback.playback_left() == 0.5  # 2000 samples out at 1000 Hz, 1500 of them played


def test_an_interrupted_turn_keeps_only_what_was_heard_and_an_unanswered_one_only_the_words() -> None:
    records = TurnRecords("s", Dialogue())
    answer = two_phrase_answer()
    answer.playback.reported_played = 1000  # the first phrase only
    record = records.get(3)
    record.user_text = "Tell me a story."
    assert records.messages_with("and more")[-1].content == "and more" and not records.dialogue.history
    end = records.end(record, answer, interrupted=True, stats={"tokens": 7.0})
    assert (end.turn, end.answer, end.spoken, end.interrupted) == (3, answer.text, "Once upon a time.", True)
    assert [m.content for m in records.dialogue.history] == ["Tell me a story.", "Once upon a time."]
    assert records.get(3) is not record  # ended: a new turn 3 would start afresh

    unanswered = records.get(4)
    unanswered.user_text = "Never mind."
    end = records.end(unanswered, None, interrupted=True, stats={})
    assert end.spoken == "" and records.dialogue.history[-1].content == "Never mind."


def test_a_record_renumbered_goes_on_under_its_new_turn() -> None:
    records = TurnRecords("s", Dialogue())
    record = records.get(1)
    record.marks["text_in"] = 42
    records.renumber(record, 2)
    assert record.turn == 2 and records.get(2) is record and records.get(1) is not record


class FakeMachine:
    state = State.USER_SPEAKING


def test_the_clock_ticks_only_while_the_core_needs_it_and_runs_one_task() -> None:
    async def scenario() -> tuple[list[TurnEvent], bool, bool]:
        machine = FakeMachine()
        ticks: list[TurnEvent] = []

        async def dispatch(event: TurnEvent) -> None:
            ticks.append(event)
            if len(ticks) == 3:
                machine.state = State.SPEAKING  # the user's floor is over: the clock stops by itself

        clock = TurnClock(machine, dispatch, name="clock-test")  # type: ignore[arg-type]
        clock.processing_audio()
        clock.run_if_needed()
        first = clock.task
        clock.run_if_needed()
        one_task = clock.task is first
        assert first is not None
        await asyncio.wait_for(first, 10)
        clock.run_if_needed()  # SPEAKING: no clock needed
        return ticks, one_task, clock.task is first

    ticks, one_task, not_restarted = asyncio.run(scenario())
    assert one_task and not_restarted and len(ticks) == 3
    assert all(isinstance(t, ClockTick) and t.audio_gap_ms == 0.0 for t in ticks)  # audio being processed


def test_marks_add_up_on_the_turns_record_and_a_mark_without_an_endpoint_keeps_the_one_before() -> None:
    records = TurnRecords("s", Dialogue())
    records.mark(2, {"speech_end": 10, "asr_final": 30}, endpoint_detected_ns=20)
    records.mark(2, {"text_in": 40})
    record = records.get(2)
    assert record.marks == {"speech_end": 10, "asr_final": 30, "text_in": 40} and record.endpoint_detected_ns == 20
