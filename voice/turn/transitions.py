"""The turn-taking machine's moves as one table, to read against the protocol (web/PROTOCOL.md's pause, resume and
clear) and the code (voice/turn/machine.py). tests/unit/test_turn_transitions.py walks every state the machine can
reach with every event and checks that it makes exactly these moves: none that is not here, and every one that is.

Speculative end of turn. The listener decodes a segment as soon as its speech has been followed by a moment of
silence (~64 ms: the likely final, `UserLikelyFinal`), and the answer starts right there (`StartAnswer(held=True)`),
while the segment is still open: the LM and the first phrase's TTS run while the end of turn is undecided. A voice that
comes back inside the segment (`UserResumed`) drops that answer. The segment's end (`UserFinal`, after ~320 ms of
silence) keeps the answer when its transcript is the one the answer started from, or replaces it (state
`USER_PAUSED`). The end of turn is confirmed by more silence (`Silence`: the silence rule, or
Smart Turn's verdict shortening or lengthening it), or by the caller saying the user is done (`UserDone`: a file's
end, push-to-talk); then the held audio is released at once (`ReleaseAnswer`). If the user speaks again first, the held
answer is dropped and counted (`CancelAnswer(ends_turn=False)`), and the next segment continues the same turn.

Released on the likely final. When both signals on the likely final's words are in (the detector's verdict on the very
audio the segment will end with, and the LM's from the answer's first pass) and the rule calls the turn complete, the
held answer is released once the silence reaches the rule's short wait (`complete_silence_ms`, 200 ms), without
waiting for the segment's end (320 ms of silence, the endpointer's): its audio, often ready before then, goes out
sooner. The segment's final comes later and only completes the turn's record. A voice that comes back inside the
segment after that (`UserResumed`) is the turn going on: the answer is cancelled and its audio cleared, as for speech
that resumes within `continuation_ms` of an answer that already spoke (`release_on_likely_final=False`: released at
the segment's end only, as half duplex must: it stops hearing the microphone once the answer plays).

Turn continuation. Speech that resumes within `continuation_ms` of the user's last voiced sample, before or while the
answer starts, continues the same user turn: the answer is cancelled (and the output cleared) without ending the turn,
the segments' transcripts are joined, and the turn gets one answer. Later speech starts a new turn, and an answer that
has not finished is cancelled then, never queued behind the new turn.

A transcript that trails off ("My brother and I...", "should I take the") waits as long as an unfinished verdict,
whatever the detector heard (`voice.listen.words.trails_off`). The LM's own probability that the message ended
there (`LmTurnVerdict`, from the answer's first pass) joins the detector's in one fitted rule (voice/end_of_turn.py).

Barge-in needs real speech. Sound heard while the assistant is speaking pauses its audio (`PauseOutput`, state
`BARGE_IN_PENDING`) and interrupts only once a word is recognised. A cough or an echo is not words: the audio resumes
(`ResumeOutput`) when its transcript comes back empty, once a decode of `resume_after_ms` of it heard no word
(`UserNoWords`: judged on what the recogniser heard, so a busy CPU that reads the words late does not resume the answer
over them), or `resume_limit_ms` after the pause however far the recogniser got (a long noise never holds the answer
back); words recognised later still barge in. The answer is never dropped for a sound.

Time. The end of turn is measured on the audio stream's own clock (`Silence`), so a slow step never stretches a pause.
But a client can stop sending audio (a muted tab, a network stall, a file client done with its clip): the shell's clock
then takes over (`ClockTick`, wall time, fed by the shell about every 100 ms, with how long it has waited for audio).
Once no audio has come for `stalled_audio_ms`, an open speech segment is ended with what was heard (`EndSegment`), and
a pause's silence goes on growing with the wall clock, so the turn ends as it would have on silent audio. The core
reads no clock itself.

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
BARGE_IN_PENDING UserNoWords        BARGE_IN_PENDING ResumeOutput             resume_after_ms of it decoded, no word
BARGE_IN_PENDING ClockTick          BARGE_IN_PENDING ResumeOutput             no word within resume_limit_ms
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
