"""The turn machine makes exactly the moves its transition table lists (voice/turn/transitions.py).

Every reachable state of the machine (up to the record fields that change what it does next) is given every event
of a small alphabet that covers each case the machine tells apart: a walk over that graph, breadth first. A move the
table lacks is a change of behaviour nobody wrote down; a row never made is a table that lies about the code.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable

from voice.turn.machine import TurnTaking
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.machine_events import (
    AnswerAudio,
    AnswerFinished,
    AssistantAnnounces,
    ClientInterrupt,
    ClockTick,
    LikelyVerdict,
    LmTurnVerdict,
    Silence,
    TurnEvent,
    TurnVerdict,
    TypedText,
    UserDone,
    UserFinal,
    UserLikelyFinal,
    UserNoWords,
    UserResumed,
    UserSpeechEnded,
    UserSpeechStarted,
    UserWords,
)
from voice.turn.transitions import TRANSITIONS

STEP_MS = 200.0  # how far both clocks move between two events of a walk
Move = tuple[str, str, str, tuple[str, ...]]


def alphabet(machine: TurnTaking, now_ms: float) -> list[TurnEvent]:
    """The events to try in `machine`'s state: each kind, with the values that lead to different cases (speech that
    continues the turn or starts a new one, a wordless decode short of or past a paused answer's wait, words that are
    or are not the likely final's, a silence past the rule's shortest wait, a verdict each way, a tick that ends a
    pause's wait or a paused answer's, and one with the client's audio stalled).
    More values reach no other row and only slow the walk."""
    answer = machine.answer_id if machine.answer_id is not None else -1
    return [
        UserSpeechStarted(now_ms + 100), UserSpeechStarted(now_ms + 5000), UserSpeechEnded(now_ms + 50), UserWords(),
        UserNoWords(now_ms + 200), UserNoWords(now_ms + 6000),
        UserLikelyFinal("what time is it?"), UserLikelyFinal("my brother and"), UserResumed(),
        UserFinal(""), UserFinal("what time is it?"), UserFinal("tell me more"),
        Silence(300), TurnVerdict(True, 0.9), TurnVerdict(False, 0.1), LikelyVerdict(0.95), LmTurnVerdict(answer, 0.95),
        UserDone(), ClockTick(now_ms + 700, 0), ClockTick(now_ms + 3000, 0), ClockTick(now_ms + 100, 1500),
        TypedText("hi"), ClientInterrupt(), AnswerAudio(answer), AnswerFinished(answer), AssistantAnnounces("timer"),
    ]


def what_matters(machine: TurnTaking) -> Hashable:
    """The machine's state and the parts of its records that decide what it does next (not the turn numbers)."""
    user, answer, contest = machine._user, machine._answer, machine._contest
    return (
        machine.state,
        user and (bool(user.text), user.done, user.released_early, user.likely_verdict is None, user.verdict is None,
                  user.silence_ms, user.stalled_ms > 0, user.segment_end_asked, user.last_voiced_ms is None),
        answer and (answer.held, answer.spoken_turn, answer.end_of_turn is None, user is not None
                    and answer.text == user.text),
        contest and (contest.paused, contest.paused_since_ms is None),
    )


def clone(machine: TurnTaking) -> TurnTaking:
    twin = copy.copy(machine)
    twin._user = copy.copy(machine._user)
    if twin._user is not None:
        twin._user.segments = list(twin._user.segments)
    twin._answer, twin._contest = copy.copy(machine._answer), copy.copy(machine._contest)
    return twin


def moves(config: TurnTakingConfig) -> set[Move]:
    """Every (state before, event, state after, actions) the machine makes from the states it can reach."""
    start = TurnTaking(config)
    seen, frontier, made = {what_matters(start)}, [start], set()
    now_ms = 0.0
    while frontier:
        reached = []
        for machine in frontier:
            for event in alphabet(machine, now_ms):
                twin = clone(machine)
                actions = twin.handle(event)
                made.add((machine.state.name, type(event).__name__, twin.state.name,
                          tuple(type(action).__name__ for action in actions)))
                if (key := what_matters(twin)) not in seen:
                    seen.add(key)
                    reached.append(twin)
        frontier, now_ms = reached, now_ms + STEP_MS
    return {move for move in made if move[3] or move[0] != move[2]}  # the rest change nothing the shell sees


def test_the_machine_makes_exactly_the_moves_of_its_table() -> None:
    # the default (early answers released on the likely final) and answers started only once the turn is sure
    made = moves(TurnTakingConfig()) | moves(TurnTakingConfig(early_answer=False))
    table = {(row.before.name, row.event, row.after.name, row.actions) for row in TRANSITIONS}
    assert len(table) == len(TRANSITIONS), "a row is listed twice"
    assert made - table == set(), "moves the table does not list"
    assert table - made == set(), "rows the machine never makes"
