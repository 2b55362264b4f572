"""The turn-taking machine's transitions as one table, to read against the protocol (PROTOCOL.md's turn events) and the
code (voice/turn/machine.py). tests/unit/test_turn_transitions.py walks every state the machine can reach with every
event and checks that the machine makes exactly these moves: none that is not here, and every one that is.

A row: the state before, the event, the state after, the actions the machine returns (in order; "-": none), and when.
An event in a state with no row for it changes neither the state nor anything the shell must do (it may still update
the turn's record: a silence's length, a verdict). Several rows for one state and event are the cases the machine
tells apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from voice.turn.machine_events import State

TABLE = """
# before         event              after            actions                  when
LISTENING        UserSpeechStarted  USER_SPEAKING    -                        a turn opens
LISTENING        TypedText          ANSWERING        StartAnswer              a typed turn
LISTENING        AssistantAnnounces ANSWERING        StartAnswer              a due timer's words, on a free floor only

USER_SPEAKING    UserLikelyFinal    USER_SPEAKING    StartAnswer              the likely final's answer starts, held
USER_SPEAKING    UserLikelyFinal    USER_SPEAKING    CancelAnswer StartAnswer ... replacing the last likely final's
USER_SPEAKING    UserResumed        USER_SPEAKING    CancelAnswer             the voice came back: that answer drops
USER_SPEAKING    Silence            ANSWERING        ReleaseAnswer            released on the likely final: both
USER_SPEAKING    LikelyVerdict      ANSWERING        ReleaseAnswer            ... verdicts call it complete and the
USER_SPEAKING    LmTurnVerdict      ANSWERING        ReleaseAnswer            ... silence reached the rule's wait
USER_SPEAKING    UserFinal          USER_PAUSED      -                        the answer started answers these words
USER_SPEAKING    UserFinal          USER_PAUSED      StartAnswer              the segment's answer starts, held
USER_SPEAKING    UserFinal          USER_PAUSED      CancelAnswer StartAnswer ... replacing the likely final's
USER_SPEAKING    UserFinal          ANSWERING        ReleaseAnswer            the user was done (UserDone): out now
USER_SPEAKING    UserFinal          ANSWERING        StartAnswer              ... started now
USER_SPEAKING    UserFinal          ANSWERING        CancelAnswer StartAnswer ... replacing the likely final's
USER_SPEAKING    UserFinal          LISTENING        -                        no words in the turn: no turn
USER_SPEAKING    UserFinal          LISTENING        CancelAnswer             ... and the likely final's answer drops
USER_SPEAKING    ClockTick          USER_SPEAKING    EndSegment               the client's audio stalled mid-speech
USER_SPEAKING    ClientInterrupt    USER_SPEAKING    CancelAnswer             the held answer ends; the voice goes on
USER_SPEAKING    ClientInterrupt    USER_SPEAKING    AbandonTurn              ... as a new turn
USER_SPEAKING    TypedText          ANSWERING        StartAnswer              typed words take the floor
USER_SPEAKING    TypedText          ANSWERING        CancelAnswer StartAnswer ... from a held answer
USER_SPEAKING    TypedText          ANSWERING        AbandonTurn StartAnswer  ... from words not yet answered
USER_SPEAKING    AnswerFinished     LISTENING        FinishTurn               the answer in flight ended

USER_PAUSED      Silence            ANSWERING        ReleaseAnswer            the end of turn is sure (the rule's
USER_PAUSED      TurnVerdict        ANSWERING        ReleaseAnswer            ... wait for the verdicts in, or the
USER_PAUSED      LmTurnVerdict      ANSWERING        ReleaseAnswer            ... stalled client's wall time, or
USER_PAUSED      ClockTick          ANSWERING        ReleaseAnswer            ... UserDone): the held answer goes out
USER_PAUSED      UserDone           ANSWERING        ReleaseAnswer            ...
USER_PAUSED      Silence            ANSWERING        StartAnswer              ... or starts (early_answer=False)
USER_PAUSED      TurnVerdict        ANSWERING        StartAnswer              ...
USER_PAUSED      ClockTick          ANSWERING        StartAnswer              ...
USER_PAUSED      UserDone           ANSWERING        StartAnswer              ...
USER_PAUSED      UserSpeechStarted  USER_SPEAKING    CancelAnswer             the user went on: same turn
USER_PAUSED      UserSpeechStarted  USER_SPEAKING    -                        ... (nothing had started)
USER_PAUSED      ClientInterrupt    LISTENING        CancelAnswer             the turn ends unanswered
USER_PAUSED      ClientInterrupt    LISTENING        AbandonTurn              ... (nothing had started)
USER_PAUSED      TypedText          ANSWERING        CancelAnswer StartAnswer typed words take the floor
USER_PAUSED      TypedText          ANSWERING        AbandonTurn StartAnswer  ... (nothing had started)
USER_PAUSED      AnswerFinished     LISTENING        FinishTurn               the answer in flight ended

ANSWERING        AnswerAudio        SPEAKING         -                        its first audio went out
ANSWERING        AnswerFinished     LISTENING        FinishTurn               it ended before any audio
ANSWERING        UserSpeechStarted  USER_SPEAKING    CancelAnswer             no audio yet: dropped, never queued
ANSWERING        UserResumed        USER_SPEAKING    CancelAnswer             released early, and the voice came back
ANSWERING        ClientInterrupt    LISTENING        CancelAnswer             the client stopped it
ANSWERING        TypedText          ANSWERING        CancelAnswer StartAnswer typed words take the floor

SPEAKING         UserSpeechStarted  BARGE_IN_PENDING PauseOutput              a sound: pause, wait for words
SPEAKING         UserResumed        USER_SPEAKING    CancelAnswer             released early, and the voice came back
SPEAKING         AnswerFinished     LISTENING        FinishTurn               the answer ended and played
SPEAKING         ClientInterrupt    LISTENING        CancelAnswer             the client stopped it
SPEAKING         TypedText          ANSWERING        CancelAnswer StartAnswer typed words take the floor

BARGE_IN_PENDING UserWords          USER_SPEAKING    CancelAnswer             words: the barge-in (or the same turn)
BARGE_IN_PENDING UserFinal          USER_PAUSED      CancelAnswer StartAnswer ... heard as a final
BARGE_IN_PENDING UserFinal          USER_PAUSED      CancelAnswer             ... (early_answer=False)
BARGE_IN_PENDING UserFinal          ANSWERING        CancelAnswer StartAnswer ... continuing a turn the user was done
BARGE_IN_PENDING UserFinal          SPEAKING         ResumeOutput             no words: a cough or an echo, play on
BARGE_IN_PENDING UserFinal          SPEAKING         -                        ... (it already played on)
BARGE_IN_PENDING ClockTick          BARGE_IN_PENDING ResumeOutput             no word within resume_after_ms
BARGE_IN_PENDING UserResumed        USER_SPEAKING    CancelAnswer             released early, and the voice came back
BARGE_IN_PENDING AnswerFinished     USER_SPEAKING    FinishTurn               it ended: the sound is a new turn
BARGE_IN_PENDING ClientInterrupt    USER_SPEAKING    CancelAnswer             the client stopped it: a new turn
BARGE_IN_PENDING TypedText          ANSWERING        CancelAnswer StartAnswer typed words take the floor
"""


@dataclass(frozen=True, slots=True)
class Transition:
    before: State
    event: str  # the event's class name (voice/turn/machine_events.py)
    after: State
    actions: tuple[str, ...]  # the actions' class names, in order
    when: str = ""


def _parse(table: str) -> tuple[Transition, ...]:
    lines = [line for line in table.splitlines() if line.strip()]
    when = lines[0].index("when")  # the header: the last column is free text
    rows = []
    for line in lines[1:]:
        if line.startswith("#"):
            continue
        before, event, after, *actions = line[:when].split()
        rows.append(Transition(State[before], event, State[after], tuple(a for a in actions if a != "-"),
                               line[when:].strip()))
    return tuple(rows)


TRANSITIONS = _parse(TABLE)
