"""The turn detector's schedule (voice/turn/detector_schedule.py) driven by lists of events: when Smart Turn is asked,
on what audio, and whether an early verdict still applies. No model, no thread, no clock."""

from __future__ import annotations

import numpy as np
import pytest

from voice.turn.detector_schedule import (
    AskDetector,
    AwaitVerdict,
    DeliverVerdict,
    DetectorAction,
    DetectorAnswered,
    DetectorEvent,
    DetectorSchedule,
    DropVerdict,
    LikelyFinalHeard,
    ScheduleClosed,
    TurnPaused,
    UserSpoke,
)
from voice.turn.machine_events import TurnVerdict

RATE = 16000


def audio(seconds: float, value: float = 0.1) -> np.ndarray:
    return np.full(int(seconds * RATE), value, np.float32)


def run(events: list[DetectorEvent], max_seconds: float = 8.0) -> list[list[DetectorAction]]:
    schedule = DetectorSchedule(threshold=0.5, max_seconds=max_seconds)
    return [schedule.handle(event) for event in events]


def test_the_early_verdict_is_the_pauses_verdict_when_the_audio_is_the_same() -> None:
    segment = audio(1.0)
    steps = run([LikelyFinalHeard(1, segment), TurnPaused(1, segment.copy()), DetectorAnswered(1, 0.9)])
    # awaited from the likely final on; answered after the pause took it: the pause's verdict
    assert steps == [[AskDetector(1, segment), AwaitVerdict(1, 1)], [], [DeliverVerdict(TurnVerdict(True, 0.9))]]
    assert np.array_equal(steps[0][0].audio, segment)  # type: ignore[union-attr]


def test_an_early_verdict_goes_to_the_machine_at_once_and_to_the_pause_from_memory() -> None:
    segment = audio(1.0)
    steps = run([LikelyFinalHeard(1, segment), DetectorAnswered(1, 0.2), TurnPaused(1, segment.copy())])
    verdict = TurnVerdict(False, 0.2)
    assert steps[1:] == [[DeliverVerdict(verdict, likely_final=True)], [DeliverVerdict(verdict)]]


def test_a_segment_that_grew_after_the_likely_final_is_judged_again() -> None:
    early, grown = audio(0.5), audio(1.0)
    steps = run([LikelyFinalHeard(1, early), TurnPaused(1, grown), DetectorAnswered(2, 0.2)])
    assert steps == [[AskDetector(1, early), AwaitVerdict(1, 1)],
                     [DropVerdict(1), AskDetector(2, grown), AwaitVerdict(2, 1)],
                     [DeliverVerdict(TurnVerdict(False, 0.2))]]
    assert len(steps[1][1].audio) == RATE  # type: ignore[union-attr]


def test_an_early_verdict_of_another_turn_does_not_apply() -> None:
    segment = audio(1.0)
    steps = run([LikelyFinalHeard(1, segment), TurnPaused(2, segment)])
    assert steps[1] == [DropVerdict(1), AskDetector(2, segment), AwaitVerdict(2, 2)]


def test_speech_makes_every_verdict_of_the_pause_moot() -> None:
    segment = audio(1.0)
    steps = run([
        LikelyFinalHeard(1, segment), TurnPaused(1, segment),  # request 1, awaited for the pause
        LikelyFinalHeard(1, audio(0.3)),  # the user spoke on and paused again: request 2, early
        UserSpoke(),
        DetectorAnswered(1, 0.9),  # arrives after the speech: dropped
    ])
    assert steps[3] == [DropVerdict(2), DropVerdict(1)]
    assert steps[4] == []


def test_a_new_likely_final_replaces_the_early_verdict_before_it() -> None:
    steps = run([LikelyFinalHeard(1, audio(0.5)), LikelyFinalHeard(1, audio(0.7)), ScheduleClosed()])
    assert steps == [[AskDetector(1, audio(0.5)), AwaitVerdict(1, 1)],
                     [DropVerdict(1), AskDetector(2, audio(0.7)), AwaitVerdict(2, 1)], [DropVerdict(2)]]


def test_the_detector_hears_the_turns_earlier_segments_and_at_most_max_seconds() -> None:
    first, second = audio(1.5, 0.1), audio(1.0, 0.2)
    steps = run([TurnPaused(1, first), UserSpoke(), TurnPaused(1, second), TurnPaused(2, second)], max_seconds=2.0)
    heard = steps[2][0].audio  # type: ignore[union-attr]
    assert len(heard) == 2 * RATE  # 2.5 s of the turn, its last 2 s
    assert np.array_equal(heard, np.concatenate([first, second])[-2 * RATE :])
    assert len(steps[3][0].audio) == RATE  # type: ignore[union-attr]  # a new turn starts from its own audio


@pytest.mark.parametrize(("probability", "complete"), [(0.5, False), (0.51, True)])
def test_complete_means_above_the_threshold(probability: float, complete: bool) -> None:
    steps = run([TurnPaused(1, audio(1.0)), DetectorAnswered(1, probability)])
    assert steps[1] == [DeliverVerdict(TurnVerdict(complete, probability))]
