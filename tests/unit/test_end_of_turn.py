"""The end-of-turn decision (voice/end_of_turn.py, fitted by scripts/train/end_of_turn_fit.py) and its place in the
turn-taking core: the detector's and the LM's probabilities combined into the wait before release, driven by event
lists, no models."""

from __future__ import annotations

import itertools
import math
import random

from scripts.train.end_of_turn_fit import fit_rule, tolerance_factor
from voice.end_of_turn import EndOfTurnRule, Signals
from voice.turn.machine import TurnTaking
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.machine_events import (
    LmTurnVerdict,
    ReleaseAnswer,
    Silence,
    StartAnswer,
    TurnVerdict,
    UserFinal,
    UserLikelyFinal,
    UserSpeechEnded,
    UserSpeechStarted,
)

# A rule whose weights the tests choose (the shipped defaults are a fit's output, free to change)
WORDS_COUNT = EndOfTurnRule(bias=0.0, audio_weight=0.5, text_weight=1.0, threshold=0.5)


def old_rule(verdict: bool | None, question: bool, trailing: bool) -> float:
    """The wait before the LM's probability existed (README, Turn-taking)."""
    if trailing:
        return 1500.0
    if verdict is None:
        return 600.0
    if verdict:
        return 200.0
    return 800.0 if question else 1500.0


def test_without_the_lms_probability_the_wait_is_smart_turns_as_before() -> None:
    rule = EndOfTurnRule()
    for verdict, question, trailing in itertools.product((None, True, False), (True, False), (True, False)):
        audio = None if verdict is None else (0.9 if verdict else 0.2)
        assert rule.wait_ms(Signals(audio, None, question, trailing)) == old_rule(verdict, question, trailing)
        assert rule.score(Signals(audio, None, question, trailing)) is None


def test_the_lms_probability_can_release_what_the_ear_held_and_hold_what_it_released() -> None:
    # logit(0.3) * 0.5 + logit(0.9) * 1.0 > 0: the words win over a doubtful ear
    assert WORDS_COUNT.wait_ms(Signals(0.3, 0.9)) == 200.0
    assert WORDS_COUNT.wait_ms(Signals(0.7, 0.05)) == 1500.0
    assert WORDS_COUNT.wait_ms(Signals(0.7, 0.05, question=True)) == 800.0
    assert WORDS_COUNT.wait_ms(Signals(0.99, 0.99, trails_off=True)) == 1500.0  # trailing off still holds
    lenient = EndOfTurnRule(0.0, 0.5, 1.0, 0.5, trails_off_holds=False)
    assert lenient.wait_ms(Signals(0.99, 0.99, trails_off=True)) == 200.0
    assert WORDS_COUNT.wait_ms(Signals(None, 0.99)) == 600.0  # no verdict yet: the silence rule


def paused_turn(machine: TurnTaking, words: str) -> int:
    """A user says `words`, pauses; the held answer starts on the likely final and the segment ends."""
    machine.handle(UserSpeechStarted(0.0))
    (start,) = machine.handle(UserLikelyFinal(words))
    assert isinstance(start, StartAnswer) and start.held
    machine.handle(UserSpeechEnded(1000.0))
    assert machine.handle(UserFinal(words)) == []
    return start.answer_id


def test_the_core_releases_at_the_short_wait_once_the_lm_hears_a_finished_message() -> None:
    machine = TurnTaking(TurnTakingConfig(end_of_turn=WORDS_COUNT))
    answer = paused_turn(machine, "Please enter the conference PIN number.")
    assert machine.handle(TurnVerdict(False, 0.3)) == []
    assert machine.handle(Silence(300.0)) == []  # Smart Turn alone: held for 1.5 s
    assert machine.handle(LmTurnVerdict(answer, 0.9)) == [ReleaseAnswer(answer)]  # 300 ms is past the short wait


def test_the_core_holds_a_cut_the_ear_called_complete_when_the_lm_hears_it_unfinished() -> None:
    machine = TurnTaking(TurnTakingConfig(end_of_turn=WORDS_COUNT))
    answer = paused_turn(machine, "After the meeting,")
    assert machine.handle(LmTurnVerdict(answer, 0.01)) == []  # no verdict yet: the silence rule, 600 ms
    assert machine.handle(TurnVerdict(True, 0.7)) == []
    assert machine.handle(Silence(1000.0)) == []
    assert machine.handle(Silence(1500.0)) == [ReleaseAnswer(answer)]


def test_the_lms_probability_counts_only_for_the_words_its_answer_started_from() -> None:
    machine = TurnTaking(TurnTakingConfig(end_of_turn=WORDS_COUNT))
    machine.handle(UserSpeechStarted(0.0))
    (old,) = machine.handle(UserLikelyFinal("After the meeting"))
    machine.handle(UserSpeechEnded(1000.0))
    actions = machine.handle(UserFinal("After the meeting, remind me"))  # other words: a new answer
    new = next(action for action in actions if isinstance(action, StartAnswer))
    assert machine.handle(LmTurnVerdict(old.answer_id, 0.99)) == []  # a dropped answer's probability
    machine.handle(TurnVerdict(False, 0.3))
    assert machine.handle(Silence(400.0)) == []
    assert machine.handle(LmTurnVerdict(new.answer_id, 0.99)) == [ReleaseAnswer(new.answer_id)]


def test_the_fit_finds_the_signal_that_separates_and_meets_the_floor() -> None:
    rng = random.Random(3)
    signals, complete = [], []
    for index in range(60):
        done = index % 2 == 0
        audio = rng.uniform(0.05, 0.95)  # the ear says nothing here
        text = rng.uniform(0.3, 0.9) if done else rng.uniform(0.001, 0.1)
        signals.append(Signals(audio, text))
        complete.append(done)
    rule = fit_rule(signals, complete)
    assert rule.text_weight > 3 * abs(rule.audio_weight)
    released = [rule.wait_ms(s) == rule.complete_ms for s in signals]
    assert all(r for r, c in zip(released, complete, strict=True) if c)
    assert not any(r for r, c in zip(released, complete, strict=True) if not c)


def test_the_tolerance_factor_matches_the_tables() -> None:
    # exact one-sided normal tolerance factors, 95 % coverage with 90 % confidence (the noncentral t quantile)
    for n, exact in ((10, 2.568), (20, 2.208), (40, 2.010)):
        assert abs(tolerance_factor(n, 0.95, 0.90) - exact) / exact < 0.03


def test_the_threshold_releases_the_floor_of_complete_utterances_the_fit_never_heard() -> None:
    """Twelve recordings fit the rule; a thousand fresh complete utterances from the same speakers must meet the 95 %
    floor. A threshold at the lowest complete utterance the fit saw releases about 12 in 13 of new ones: it fails."""
    rng = random.Random(7)

    def utterance(done: bool) -> Signals:
        audio = 1 / (1 + math.exp(-rng.gauss(1.0 if done else -0.5, 1.5)))
        text = 1 / (1 + math.exp(-rng.gauss(-1.0 if done else -5.0, 1.0)))
        return Signals(audio, text)

    signals, complete, groups = [], [], []
    for recording in range(12):
        for done in (True, False, False):
            signals.append(utterance(done))
            complete.append(done)
            groups.append(f"r{recording}")
    rule = fit_rule(signals, complete, groups)
    fresh = [rule.wait_ms(utterance(True)) == rule.complete_ms for _ in range(1000)]
    assert sum(fresh) / len(fresh) >= 0.95
    cuts = [rule.wait_ms(utterance(False)) > rule.complete_ms for _ in range(1000)]
    assert sum(cuts) / len(cuts) >= 0.8  # and it still holds most cuts: the bound is not "release everything"
