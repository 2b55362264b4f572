"""The session's core (voice/turn/session_core.py) driven by lists of events: when the turn detector is asked and
whether its verdict still counts, how a turn is timed, half duplex, clearing only what was heard, and when the session
is idle. No models, no threads, no sleeps, no event loop."""

from __future__ import annotations

import numpy as np
import pytest

from voice.turn.detector_schedule import AskDetector, AwaitVerdict, DetectorAnswered, DetectorSchedule, DropVerdict
from voice.turn.machine import TurnTakingError
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.machine_events import (
    AnswerAudio,
    AnswerFinished,
    CancelAnswer,
    ClientInterrupt,
    FinishTurn,
    LmTurnVerdict,
    PauseOutput,
    ReleaseAnswer,
    Silence,
    StartAnswer,
    State,
    UserDone,
    UserFinal,
    UserSpeechStarted,
)
from voice.turn.session_core import (
    FinalTranscript,
    LikelyFinalDecoding,
    MarkTurn,
    PartialTranscript,
    SessionClosed,
    SessionCore,
    TextTyped,
    UserSpeechEnded,
)


def audio(seconds: float) -> np.ndarray:
    return np.full(int(seconds * 16000), 0.1, np.float32)


def with_detector(**config) -> SessionCore:
    return SessionCore(TurnTakingConfig(**config), DetectorSchedule(threshold=0.5, max_seconds=8.0))


def drive(core: SessionCore, *events) -> list:
    actions = []
    for event in events:
        actions.extend(core.handle(event))
    return actions


def test_the_early_verdict_judges_the_pause_and_releases_the_answer_without_asking_again() -> None:
    core = with_detector()
    segment = audio(1.0)
    assert drive(core, UserSpeechStarted(0.0), LikelyFinalDecoding(segment)) == [
        AskDetector(1, segment), AwaitVerdict(1, 1)]
    assert drive(core, PartialTranscript("Is it raining?", likely_final=True, t_ns=5_000)) == [
        StartAnswer(1, 1, "Is it raining?", held=True)]
    assert drive(core, UserSpeechEnded(1000.0, t_ns=4_000, detected_ns=6_000)) == []
    # the pause takes the verdict already asked for (and awaited) on this very audio: no second call
    assert drive(core, FinalTranscript("Is it raining?", t_ns=7_000, segment=segment.copy())) == [
        MarkTurn(1, {"speech_end": 4_000, "asr_final": 5_000}, 6_000)]
    assert drive(core, Silence(250.0)) == []  # no verdict yet: the 600 ms silence rule
    assert drive(core, DetectorAnswered(1, 0.9)) == [ReleaseAnswer(1)]  # complete: 200 ms of silence is enough


@pytest.mark.parametrize("full_duplex", [True, False])
def test_an_answer_released_on_its_likely_final_is_timed_at_its_segments_end(full_duplex: bool) -> None:
    """Both verdicts call the likely final complete: released 200 ms after the last word in full duplex, timed then
    from the likely final's last voiced sample (the segment's end adds the endpoint's moment); half duplex waits for
    that end (the microphone is not heard once the answer plays)."""
    core = SessionCore(TurnTakingConfig(), DetectorSchedule(threshold=0.5, max_seconds=8.0), full_duplex=full_duplex)
    segment = audio(1.0)
    drive(core, UserSpeechStarted(0.0), LikelyFinalDecoding(segment, speech_end_ns=4_000), DetectorAnswered(1, 0.9))
    assert drive(core, PartialTranscript("What time is it?", likely_final=True, t_ns=5_000)) == [
        StartAnswer(1, 1, "What time is it?", held=True)]
    released = drive(core, LmTurnVerdict(1, 0.9), Silence(220.0))
    assert released == ([MarkTurn(1, {"speech_end": 4_000, "asr_final": 5_000}), ReleaseAnswer(1)] if full_duplex
                        else [])
    drive(core, UserSpeechEnded(1000.0, t_ns=4_000, detected_ns=6_000))
    final = drive(core, FinalTranscript("What time is it?", t_ns=7_000, segment=segment.copy()))
    # the verdict on the likely final is the pause's too: no second call either way
    assert final == [MarkTurn(1, {"speech_end": 4_000, "asr_final": 5_000}, 6_000)]
    assert drive(core, Silence(340.0)) == ([] if full_duplex else [ReleaseAnswer(1)])
    assert core.state is State.ANSWERING


def test_an_answer_released_on_its_likely_final_keeps_its_timing_if_it_ends_before_the_segment() -> None:
    core = with_detector()
    drive(core, UserSpeechStarted(0.0), LikelyFinalDecoding(audio(1.0), speech_end_ns=4_000), DetectorAnswered(1, 0.9))
    drive(core, PartialTranscript("Thanks.", likely_final=True, t_ns=5_000), LmTurnVerdict(1, 0.9))
    assert drive(core, Silence(220.0), AnswerAudio(1), AnswerFinished(1)) == [
        MarkTurn(1, {"speech_end": 4_000, "asr_final": 5_000}), ReleaseAnswer(1), FinishTurn(1, 1, 1, 0)]
    drive(core, UserSpeechEnded(1000.0, t_ns=4_000, detected_ns=6_000))
    assert drive(core, FinalTranscript("Thanks.", t_ns=7_000, segment=audio(1.0))) == []  # the turn is over
    assert core.state is State.LISTENING


def test_speech_drops_the_pauses_verdicts_before_the_machine_hears_it() -> None:
    core = with_detector()
    drive(core, UserSpeechStarted(0.0), UserSpeechEnded(1000.0, t_ns=1, detected_ns=2))
    actions = drive(core, FinalTranscript("Tell me about", t_ns=3, segment=audio(1.0)))
    assert actions == [MarkTurn(1, {"speech_end": 1, "asr_final": 3}, 2), StartAnswer(1, 1, "Tell me about", held=True),
                       AskDetector(1, audio(1.0)), AwaitVerdict(1, 1)]
    assert drive(core, UserSpeechStarted(1400.0)) == [
        DropVerdict(1), CancelAnswer(1, 1, "user_continued", clear=False, ends_turn=False, speculations=1, dropped=1)]
    assert drive(core, DetectorAnswered(1, 0.9)) == []  # it came after the speech: moot
    assert core.state is State.USER_SPEAKING
    assert drive(core, LikelyFinalDecoding(audio(0.5)), SessionClosed()) == [
        AskDetector(2, audio(0.5)), AwaitVerdict(2, 1), DropVerdict(2)]


def test_the_detector_is_asked_only_for_a_pause() -> None:
    confirmed = with_detector()  # the caller said the turn ends here: no pause to judge
    drive(confirmed, UserSpeechStarted(0.0), UserDone(), UserSpeechEnded(900.0, t_ns=10, detected_ns=20))
    assert drive(confirmed, FinalTranscript("Hello", t_ns=30, segment=audio(1.0))) == [
        MarkTurn(1, {"speech_end": 10, "asr_final": 30}, 20), StartAnswer(1, 1, "Hello", held=False)]
    noise = with_detector()  # no words, no turn, nothing to judge or time
    drive(noise, UserSpeechStarted(0.0), UserSpeechEnded(300.0, t_ns=1, detected_ns=2))
    assert drive(noise, FinalTranscript("", t_ns=3, segment=audio(0.3))) == []
    assert noise.state is State.LISTENING


def test_without_a_detector_the_silence_rule_alone_ends_the_pause() -> None:
    core = SessionCore(TurnTakingConfig(silence_rule_ms=600))
    assert drive(core, UserSpeechStarted(0.0), LikelyFinalDecoding(audio(1.0))) == []
    drive(core, UserSpeechEnded(1000.0, t_ns=1, detected_ns=2))
    assert drive(core, FinalTranscript("Done.", t_ns=3, segment=audio(1.0))) == [
        MarkTurn(1, {"speech_end": 1, "asr_final": 3}, 2), StartAnswer(1, 1, "Done.", held=True)]
    assert drive(core, Silence(599.0)) == []
    assert drive(core, Silence(600.0)) == [ReleaseAnswer(1)]


def test_the_likely_final_is_judged_for_the_turn_its_words_will_open() -> None:
    """Contested speech during playback belongs to the turn it would open; once it proves to be words, its pause
    reuses the verdict asked for at its likely final."""
    core = with_detector()
    drive(core, TextTyped("Tell me a story.", t_ns=1), AnswerAudio(1))
    segment = audio(1.0)
    assert drive(core, UserSpeechStarted(9000.0)) == [PauseOutput(1, 1)]
    assert drive(core, LikelyFinalDecoding(segment)) == [AskDetector(1, segment), AwaitVerdict(1, 2)]
    assert drive(core, PartialTranscript("Stop", likely_final=True, t_ns=10)) == [
        CancelAnswer(1, 1, "barge_in", clear=True, ends_turn=True), StartAnswer(2, 2, "Stop", held=True)]
    drive(core, UserSpeechEnded(9500.0, t_ns=20, detected_ns=30))
    assert drive(core, FinalTranscript("Stop", t_ns=40, segment=segment.copy())) == [
        MarkTurn(2, {"speech_end": 20, "asr_final": 10}, 30)]


def test_a_turn_is_timed_by_its_last_segment_and_the_transcript_its_answer_started_from() -> None:
    replaced = SessionCore()  # the final's words differ from the likely final's: the final's answer and time count
    drive(replaced, UserSpeechStarted(0.0), PartialTranscript("Play some", likely_final=True, t_ns=100))
    drive(replaced, UserSpeechEnded(900.0, t_ns=50, detected_ns=150))
    actions = drive(replaced, FinalTranscript("Play some music", t_ns=200, segment=audio(1.0)))
    assert actions[0] == MarkTurn(1, {"speech_end": 50, "asr_final": 200}, 150)
    assert [type(action) for action in actions] == [MarkTurn, CancelAnswer, StartAnswer]

    continued = SessionCore()  # two segments, one turn: the second one times it
    drive(continued, UserSpeechStarted(0.0), UserSpeechEnded(800.0, t_ns=10, detected_ns=20))
    drive(continued, FinalTranscript("I was wondering", t_ns=30, segment=audio(1.0)), UserSpeechStarted(1200.0))
    drive(continued, UserSpeechEnded(2000.0, t_ns=40, detected_ns=50))
    actions = drive(continued, FinalTranscript("about the weather.", t_ns=60, segment=audio(1.0)))
    assert actions[0] == MarkTurn(1, {"speech_end": 40, "asr_final": 60}, 50)

    typed = SessionCore()  # a typed turn counts from the text's arrival
    assert drive(typed, TextTyped("Hello", t_ns=42)) == [
        MarkTurn(1, {"text_in": 42}), StartAnswer(1, 1, "Hello", held=False)]


def test_silence_counts_only_in_a_pause() -> None:
    """The shell reports every chunk's silence without asking the state: only a pause's silence ends a turn."""
    core = SessionCore(TurnTakingConfig(silence_rule_ms=600))
    assert drive(core, UserSpeechStarted(0.0), Silence(5000.0)) == []
    ended = UserSpeechEnded(1000.0, t_ns=1, detected_ns=2)
    drive(core, ended, FinalTranscript("Hi there.", t_ns=3, segment=audio(1.0)))
    assert core.state is State.USER_PAUSED  # the silence reported while speaking ended nothing
    assert drive(core, Silence(599.0)) == []
    assert drive(core, Silence(600.0)) == [ReleaseAnswer(1)]
    assert drive(core, Silence(5000.0)) == []  # answering: silence changes nothing


@pytest.mark.parametrize("full_duplex", [False, True])
def test_half_duplex_does_not_hear_the_microphone_while_the_answer_plays(full_duplex: bool) -> None:
    core = SessionCore(TurnTakingConfig(), full_duplex=full_duplex)
    heard = [core.accepts_audio]
    drive(core, TextTyped("Tell me a story.", t_ns=1))
    heard.append(core.accepts_audio)  # answering, nothing plays yet
    drive(core, AnswerAudio(1))
    heard.append(core.accepts_audio)
    drive(core, UserSpeechStarted(9000.0))  # speech already heard before the audio started: contested
    heard.append(core.accepts_audio)
    drive(core, AnswerFinished(1))
    heard.append(core.accepts_audio)
    assert heard == ([True] * 5 if full_duplex else [True, True, False, False, True])


def test_clear_only_an_answer_whose_audio_went_out() -> None:
    core = SessionCore()
    drive(core, TextTyped("one", t_ns=1))
    assert drive(core, ClientInterrupt()) == [CancelAnswer(1, 1, "interrupt", clear=False, ends_turn=True)]
    drive(core, TextTyped("two", t_ns=2), AnswerAudio(2))
    assert drive(core, ClientInterrupt()) == [CancelAnswer(2, 2, "interrupt", clear=True, ends_turn=True)]
    drive(core, TextTyped("three", t_ns=3), AnswerAudio(2))  # audio of an answer already cancelled: not this one's
    assert drive(core, TextTyped("four", t_ns=4))[1] == CancelAnswer(3, 3, "new_text", clear=False, ends_turn=True)


def test_the_session_is_idle_only_when_nobody_holds_the_floor_and_no_answer_runs() -> None:
    core = SessionCore(TurnTakingConfig(silence_rule_ms=300))
    idle = [core.idle]
    drive(core, UserSpeechStarted(0.0))
    idle.append(core.idle)
    drive(core, UserSpeechEnded(1000.0, t_ns=1, detected_ns=2), FinalTranscript("Hello.", t_ns=3, segment=audio(1.0)))
    idle.append(core.idle)  # paused, the answer held
    drive(core, Silence(400.0), AnswerAudio(1))
    idle.append(core.idle)  # speaking
    drive(core, AnswerFinished(1))
    idle.append(core.idle)
    drive(core, UserSpeechStarted(5000.0), UserSpeechEnded(5300.0, t_ns=4, detected_ns=5))
    drive(core, FinalTranscript("", t_ns=6, segment=audio(0.3)))
    idle.append(core.idle)  # a noise opened no turn
    drive(core, TextTyped("Hi", t_ns=7))
    idle.append(core.idle)
    drive(core, ClientInterrupt())
    idle.append(core.idle)
    assert idle == [True, False, False, False, True, True, False, True]


def test_events_the_core_must_see_first_are_refused_from_the_shell() -> None:
    """The machine's own segment events carry no timing and no audio: passing them straight through would skip the
    turn's marks and the detector."""
    with pytest.raises(TurnTakingError):
        SessionCore().handle(UserFinal("hi"))  # type: ignore[arg-type]
    with pytest.raises(TurnTakingError):
        SessionCore().handle("speech")  # type: ignore[arg-type]
