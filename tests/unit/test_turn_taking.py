"""The turn-taking core, driven by lists of events: no models, no sleeps, no event loop."""

from __future__ import annotations

import pytest

from voice.turn.machine import TurnTaking, TurnTakingError
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.machine_events import (
    AbandonTurn,
    AnswerAudio,
    AnswerFinished,
    CancelAnswer,
    ClientInterrupt,
    ClockTick,
    EndSegment,
    FinishTurn,
    LikelyVerdict,
    LmTurnVerdict,
    PauseOutput,
    ReleaseAnswer,
    ResumeOutput,
    Silence,
    StartAnswer,
    State,
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

MS = 1  # the turn-taking clock is the audio stream's, in milliseconds


def drive(machine: TurnTaking, *events) -> list:
    actions = []
    for event in events:
        actions.extend(machine.handle(event))
    return actions


def segment(start_ms: int, end_ms: int, text: str) -> list:
    return [UserSpeechStarted(start_ms * MS), UserSpeechEnded(end_ms * MS), UserFinal(text)]


def test_a_turn_starts_its_answer_at_the_pause_and_releases_it_once_the_silence_confirms():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=600))
    actions = drive(machine, *segment(0, 1000, "What time is it?"))
    assert actions == [StartAnswer(1, 1, "What time is it?", held=True)]
    assert machine.state is State.USER_PAUSED
    assert drive(machine, Silence(300)) == []
    assert drive(machine, Silence(600)) == [ReleaseAnswer(1)]
    assert machine.state is State.ANSWERING
    drive(machine, AnswerAudio(1))
    assert machine.state is State.SPEAKING
    assert drive(machine, AnswerFinished(1)) == [FinishTurn(1, 1, speculations=1, dropped=0)]
    assert machine.state is State.LISTENING


def test_speech_resuming_in_the_pause_drops_the_speculation_and_continues_the_same_turn():
    machine = TurnTaking()
    drive(machine, *segment(0, 1000, "Tell me about"))
    actions = drive(machine, Silence(200), UserSpeechStarted(1400 * MS))
    assert actions == [CancelAnswer(1, 1, "user_continued", clear=False, ends_turn=False, speculations=1, dropped=1)]
    actions = drive(machine, UserSpeechEnded(2500 * MS), UserFinal("the weather."))
    assert actions == [StartAnswer(2, 1, "Tell me about the weather.", held=True)]
    drive(machine, Silence(700))
    assert drive(machine, AnswerFinished(2)) == [FinishTurn(2, 1, speculations=2, dropped=1)]


def test_speech_resuming_after_the_end_of_turn_but_before_the_answer_speaks_continues_the_turn():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300, continuation_ms=1200))
    drive(machine, *segment(0, 1000, "Two clips"), Silence(400))
    assert machine.state is State.ANSWERING
    actions = drive(machine, UserSpeechStarted(1600 * MS))
    assert actions == [CancelAnswer(1, 1, "user_continued", clear=False, ends_turn=False, speculations=1, dropped=1)]
    actions = drive(machine, UserSpeechEnded(3000 * MS), UserFinal("joined by silence."))
    assert actions == [StartAnswer(2, 1, "Two clips joined by silence.", held=True)]


def test_speech_resuming_while_the_answer_speaks_continues_the_turn_once_it_is_words():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300, continuation_ms=1200))
    drive(machine, *segment(0, 1000, "Two clips"), Silence(400), AnswerAudio(1))
    assert drive(machine, UserSpeechStarted(1800 * MS)) == [PauseOutput(1, 1)]  # a cough? pause, wait for words
    actions = drive(machine, UserWords())
    assert actions == [CancelAnswer(1, 1, "user_continued", clear=True, ends_turn=False, speculations=1, dropped=1,
                                    continues_as=2)]  # a cleared turn's audio is refused: the rest gets a new number
    assert drive(machine, UserSpeechEnded(3000 * MS), UserFinal("and more.")) == [
        StartAnswer(2, 2, "Two clips and more.", held=True)]


def test_a_late_new_question_cancels_a_stale_answer_instead_of_queueing_it():
    """Issue 21: an answer belongs to its turn; a new turn cancels an answer that has not spoken yet."""
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300, continuation_ms=1200))
    drive(machine, *segment(0, 1000, "First question."), Silence(400))
    actions = drive(machine, UserSpeechStarted(5000 * MS))
    assert actions == [CancelAnswer(1, 1, "new_turn", clear=False, ends_turn=True, speculations=1, dropped=0)]
    assert machine.user_turn == 2
    assert drive(machine, UserSpeechEnded(6000 * MS), UserFinal("Second.")) == [
        StartAnswer(2, 2, "Second.", held=True)]
    assert drive(machine, AnswerFinished(1)) == []  # the cancelled answer's end changes nothing


def test_a_cough_during_playback_pauses_the_answer_and_resumes_it_when_it_proves_wordless():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300))
    drive(machine, *segment(0, 1000, "Hello."), Silence(400), AnswerAudio(1))
    assert drive(machine, UserSpeechStarted(9000 * MS)) == [PauseOutput(1, 1)]
    assert drive(machine, UserSpeechEnded(9300 * MS), UserFinal("")) == [ResumeOutput(1, 1)]
    assert machine.state is State.SPEAKING
    assert drive(machine, AnswerFinished(1)) == [FinishTurn(1, 1, 1, 0)]


def test_a_paused_answer_resumes_once_the_sound_decodes_wordless_and_later_words_still_barge_in():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300, resume_after_ms=600, resume_limit_ms=2000))
    drive(machine, *segment(0, 1000, "Hello."), Silence(400), AnswerAudio(1))
    assert drive(machine, UserSpeechStarted(9000 * MS)) == [PauseOutput(1, 1)]
    # the wall clock alone does not resume it: a recogniser that is behind has not yet heard whether it is words
    assert drive(machine, ClockTick(50_000, 0), ClockTick(51_900, 0)) == []
    assert drive(machine, UserNoWords(9500 * MS)) == []  # 500 ms of it decoded: no words yet
    assert drive(machine, UserNoWords(9600 * MS)) == [ResumeOutput(1, 1)]  # a long noise
    assert drive(machine, UserNoWords(9800 * MS), ClockTick(53_000, 0)) == []  # resumed once
    actions = drive(machine, UserWords())  # the noise was speech after all
    assert actions == [CancelAnswer(1, 1, "barge_in", clear=True, ends_turn=True, speculations=1, dropped=0)]


def test_a_paused_answer_resumes_on_the_clock_when_the_recogniser_is_too_slow_to_tell():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300, resume_after_ms=600, resume_limit_ms=2000))
    drive(machine, *segment(0, 1000, "Hello."), Silence(400), AnswerAudio(1))
    assert drive(machine, UserSpeechStarted(9000 * MS)) == [PauseOutput(1, 1)]
    assert drive(machine, ClockTick(50_000, 0), ClockTick(51_900, 0)) == []  # the first tick starts the wait
    assert drive(machine, ClockTick(52_000, 0)) == [ResumeOutput(1, 1)]
    assert drive(machine, UserNoWords(9600 * MS), ClockTick(53_000, 0)) == []  # resumed once


def test_a_client_that_stops_sending_audio_in_a_pause_still_gets_its_turn_ended():
    """The audio clock stops with the audio: the shell's clock ends the turn after the same silence."""
    machine = TurnTaking(TurnTakingConfig(incomplete_silence_ms=2000, stalled_audio_ms=1000))
    drive(machine, *segment(0, 1000, "I would like"), Silence(250), TurnVerdict(complete=False))
    assert drive(machine, ClockTick(10_000, 0), ClockTick(10_900, 900)) == []  # late, not stopped
    assert drive(machine, ClockTick(11_500, 1500)) == []  # stopped: 250 + 1500 ms of silence so far
    assert drive(machine, ClockTick(11_750, 1750)) == [ReleaseAnswer(1)]  # 250 + 1750: the 2 s an unfinished turn waits
    assert machine.state is State.ANSWERING


def test_audio_that_comes_back_after_a_stall_is_counted_on_the_audio_clock_again():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=2000, stalled_audio_ms=1000))
    drive(machine, *segment(0, 1000, "Hi"), Silence(100))
    assert drive(machine, ClockTick(0, 1500)) == []  # 100 + 1500
    assert drive(machine, Silence(300), Silence(600)) == []  # the audio is back: 600 ms heard, the stall is over
    assert drive(machine, ClockTick(0, 1400)) == [ReleaseAnswer(1)]  # 600 + 1400


def test_a_client_that_stops_sending_audio_mid_speech_gets_its_segment_ended():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=600, stalled_audio_ms=1000))
    drive(machine, UserSpeechStarted(0))
    assert drive(machine, ClockTick(0, 500)) == []
    assert drive(machine, ClockTick(0, 1000)) == [EndSegment()]
    assert drive(machine, ClockTick(0, 1100)) == []  # asked once per stall
    actions = drive(machine, UserSpeechEnded(900 * MS), UserFinal("What is the time"), Silence(40))
    assert actions == [StartAnswer(1, 1, "What is the time", held=True)]
    assert drive(machine, ClockTick(0, 1200)) == [ReleaseAnswer(1)]  # 40 ms heard + 1200 ms of stopped audio


def test_real_words_during_playback_are_a_barge_in_and_a_new_turn():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300))
    drive(machine, *segment(0, 1000, "Hello."), Silence(400), AnswerAudio(1))
    actions = drive(machine, UserSpeechStarted(9000 * MS), UserWords())
    assert actions == [PauseOutput(1, 1),
                       CancelAnswer(1, 1, "barge_in", clear=True, ends_turn=True, speculations=1, dropped=0)]
    assert machine.state is State.USER_SPEAKING and machine.user_turn == 2


def test_a_barge_in_proven_only_by_its_final_transcript_starts_the_next_answer_after_cancelling():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300))
    drive(machine, *segment(0, 1000, "Hello."), Silence(400), AnswerAudio(1))
    actions = drive(machine, UserSpeechStarted(9000 * MS), UserSpeechEnded(9300 * MS), UserFinal("Stop."))
    assert [type(a) for a in actions] == [PauseOutput, CancelAnswer, StartAnswer]
    assert actions[2] == StartAnswer(2, 2, "Stop.", held=True)


def test_a_spoken_final_while_a_typed_answer_runs_never_starts_a_second_answer():
    """Review finding: `send_text` left the listening turn open and its final started a concurrent answer."""
    machine = TurnTaking()
    drive(machine, UserSpeechStarted(0))
    actions = drive(machine, TypedText("typed"))
    assert actions == [StartAnswer(1, 2, "typed", held=False)]
    assert drive(machine, UserSpeechEnded(1000 * MS), UserFinal("spoken words")) == []
    assert machine.answer_id == 1


def test_a_typed_message_cancels_the_answer_in_progress_before_starting_its_own():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300))
    drive(machine, *segment(0, 1000, "Hello."), Silence(400), AnswerAudio(1))
    actions = drive(machine, TypedText("typed"))
    assert actions == [CancelAnswer(1, 1, "new_text", clear=True, ends_turn=True, speculations=1, dropped=0),
                       StartAnswer(2, 2, "typed", held=False)]
    starts = [a for a in actions if isinstance(a, StartAnswer)]
    cancels = [a for a in actions if isinstance(a, CancelAnswer)]
    assert len(starts) == len(cancels) == 1


def test_a_typed_message_during_a_paused_spoken_turn_ends_that_turn_unanswered():
    machine = TurnTaking(TurnTakingConfig(early_answer=False))
    drive(machine, *segment(0, 1000, "Hello."))
    actions = drive(machine, TypedText("typed"))
    assert actions == [AbandonTurn(1, "Hello."), StartAnswer(1, 2, "typed", held=False)]


def test_without_speculation_the_answer_starts_at_the_confirmed_end_of_turn():
    machine = TurnTaking(TurnTakingConfig(early_answer=False, silence_rule_ms=300))
    assert drive(machine, *segment(0, 1000, "Hi.")) == []
    assert drive(machine, Silence(300)) == [StartAnswer(1, 1, "Hi.", held=False)]


def test_explicit_end_ignores_silence_and_ends_the_turn_on_user_done():
    machine = TurnTaking(TurnTakingConfig(explicit_end=True))
    drive(machine, *segment(0, 1000, "One file"), Silence(5000))
    assert machine.state is State.USER_PAUSED
    drive(machine, UserSpeechStarted(6000 * MS))
    assert drive(machine, UserDone()) == []  # still speaking: the next segment end confirms
    actions = drive(machine, UserSpeechEnded(7000 * MS), UserFinal("with a long pause."))
    assert actions == [StartAnswer(2, 1, "One file with a long pause.", held=False)]
    assert machine.state is State.ANSWERING


def test_user_done_in_the_pause_releases_at_once():
    machine = TurnTaking(TurnTakingConfig(explicit_end=True))
    drive(machine, *segment(0, 1000, "One file."))
    assert drive(machine, UserDone()) == [ReleaseAnswer(1)]


def test_the_turn_detector_shortens_or_lengthens_the_wait():
    config = TurnTakingConfig(silence_rule_ms=600, complete_silence_ms=200, incomplete_silence_ms=2000)
    machine = TurnTaking(config)
    drive(machine, *segment(0, 1000, "Done."), Silence(200))
    assert drive(machine, TurnVerdict(complete=True)) == [ReleaseAnswer(1)]
    machine = TurnTaking(config)
    drive(machine, *segment(0, 1000, "I think that"), TurnVerdict(complete=False))
    assert drive(machine, Silence(1500)) == []
    assert drive(machine, Silence(2000)) == [ReleaseAnswer(1)]


def test_noise_without_words_opens_no_turn():
    machine = TurnTaking()
    assert drive(machine, *segment(0, 300, "")) == []
    assert machine.state is State.LISTENING
    drive(machine, *segment(1000, 2000, "Hello."))
    assert machine.user_turn == 2  # the noise used a number; nothing was answered or ended for it


def test_an_empty_resumed_segment_keeps_the_words_of_the_turn_and_answers_them():
    machine = TurnTaking()
    drive(machine, *segment(0, 1000, "Hello there."))
    drive(machine, UserSpeechStarted(1300 * MS))  # a cough drops the speculation...
    actions = drive(machine, UserSpeechEnded(1500 * MS), UserFinal(""))
    assert actions == [StartAnswer(2, 1, "Hello there.", held=True)]  # ...but never the answer


def test_interrupt_cancels_and_clears_only_audio_that_went_out():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300))
    drive(machine, *segment(0, 1000, "Hello."), Silence(400))
    actions = drive(machine, ClientInterrupt())
    assert actions == [CancelAnswer(1, 1, "interrupt", clear=False, ends_turn=True, speculations=1, dropped=0)]
    assert machine.state is State.LISTENING
    assert drive(machine, ClientInterrupt()) == []


def test_the_answer_ending_during_contested_speech_hands_that_speech_a_new_turn():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300))
    drive(machine, *segment(0, 1000, "Hello."), Silence(400), AnswerAudio(1), UserSpeechStarted(9000 * MS))
    assert drive(machine, AnswerFinished(1)) == [FinishTurn(1, 1, 1, 0)]
    assert machine.state is State.USER_SPEAKING and machine.user_turn == 2


def test_an_unknown_event_is_a_clear_error():
    with pytest.raises(TurnTakingError):
        TurnTaking().handle("speech")  # type: ignore[arg-type]


def test_at_most_one_answer_whatever_the_order_of_events():
    """Every StartAnswer follows the CancelAnswer or FinishTurn of the answer before it."""
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=300))
    events = [*segment(0, 1000, "a"), Silence(400), TypedText("b"), UserSpeechStarted(2000 * MS), UserWords(),
              UserSpeechEnded(2500 * MS), UserFinal("c"), TypedText("d"), AnswerAudio(4), UserSpeechStarted(3000 * MS),
              UserFinal("e"), Silence(500), AnswerFinished(5)]
    live: set[int] = set()
    for event in events:
        for action in machine.handle(event):
            if isinstance(action, StartAnswer):
                assert not live, f"second answer {action} while {live} runs"
                live.add(action.answer_id)
            elif isinstance(action, CancelAnswer | FinishTurn):
                live.discard(action.answer_id)


def test_the_answer_starts_on_the_likely_final_and_the_segments_end_keeps_it():
    machine = TurnTaking(TurnTakingConfig(silence_rule_ms=600))
    drive(machine, UserSpeechStarted(0))
    # a moment of silence after the speech: the segment is decoded whole and the answer starts, held
    assert drive(machine, UserLikelyFinal("What time is it?")) == [StartAnswer(1, 1, "What time is it?", held=True)]
    assert machine.state is State.USER_SPEAKING  # the segment is still open
    # the segment ends with the same words: nothing restarts
    assert drive(machine, UserSpeechEnded(1000), UserFinal("What time is it?")) == []
    assert machine.state is State.USER_PAUSED
    assert drive(machine, Silence(600)) == [ReleaseAnswer(1)]
    drive(machine, AnswerAudio(1))
    assert drive(machine, AnswerFinished(1)) == [FinishTurn(1, 1, speculations=1, dropped=0)]


def test_a_voice_coming_back_inside_the_segment_drops_the_likely_answer():
    machine = TurnTaking()
    drive(machine, UserSpeechStarted(0))
    drive(machine, UserLikelyFinal("I was wondering"))
    dropped = CancelAnswer(1, 1, "user_continued", clear=False, ends_turn=False, speculations=1, dropped=1)
    assert drive(machine, UserResumed()) == [dropped]
    assert drive(machine, UserResumed()) == []  # nothing left to drop
    # the next moment of silence starts the answer to everything said
    start = drive(machine, UserLikelyFinal("I was wondering what the weather will be"))
    assert start == [StartAnswer(2, 1, "I was wondering what the weather will be", held=True)]
    assert drive(machine, UserSpeechEnded(2000), UserFinal("I was wondering what the weather will be")) == []
    assert machine.state is State.USER_PAUSED


def test_a_likely_final_both_signals_call_complete_is_released_before_its_segment_ends():
    machine = TurnTaking()
    # as they come: the detector's verdict on the likely final's audio, its transcript, the LM's verdict
    drive(machine, UserSpeechStarted(0), LikelyVerdict(0.9), UserLikelyFinal("What time is it?"))
    assert drive(machine, LmTurnVerdict(1, 0.9), Silence(150)) == []  # the rule's short wait is 200 ms
    assert drive(machine, Silence(200)) == [ReleaseAnswer(1)]
    assert machine.state is State.ANSWERING and machine.released_early
    drive(machine, AnswerAudio(1))
    # the segment's end only completes the turn's record
    assert drive(machine, UserSpeechEnded(1000), UserFinal("What time is it?")) == []
    assert machine.state is State.SPEAKING and not machine.released_early
    assert drive(machine, AnswerFinished(1)) == [FinishTurn(1, 1, speculations=1, dropped=0)]


@pytest.mark.parametrize("verdicts", [
    [LikelyVerdict(0.9)],  # no LM verdict yet
    [LmTurnVerdict(1, 0.9)],  # no detector verdict yet
    [LikelyVerdict(0.1), LmTurnVerdict(1, 0.01)],  # the rule calls it unfinished
    [LikelyVerdict(0.9), LikelyVerdict(None), LmTurnVerdict(1, 0.9)],  # a new likely final is being judged
])
def test_a_likely_final_waits_for_its_segments_end_unless_both_signals_call_it_complete(verdicts: list) -> None:
    machine = TurnTaking()
    drive(machine, UserSpeechStarted(0), UserLikelyFinal("Turn on the lights."))
    assert drive(machine, *verdicts, Silence(300)) == []
    assert machine.state is State.USER_SPEAKING


def test_no_release_before_the_segment_ends_where_the_config_says_so_or_on_audio_the_voice_went_on_from():
    off = TurnTaking(TurnTakingConfig(release_on_likely_final=False))  # half duplex's config (session_core.py)
    drive(off, UserSpeechStarted(0), UserLikelyFinal("What time is it?"), LikelyVerdict(0.9), LmTurnVerdict(1, 0.9))
    assert drive(off, Silence(300)) == []
    resumed = TurnTaking()
    drive(resumed, UserSpeechStarted(0), UserLikelyFinal("What time"), LikelyVerdict(0.9), UserResumed())
    drive(resumed, UserLikelyFinal("What time is it?"), LmTurnVerdict(2, 0.9))
    assert drive(resumed, Silence(300)) == []


def test_a_voice_coming_back_after_an_early_release_continues_the_turn_and_clears_what_was_heard():
    machine = TurnTaking()
    drive(machine, UserSpeechStarted(0), UserLikelyFinal("Call my sister."), LikelyVerdict(0.9), LmTurnVerdict(1, 0.9))
    drive(machine, Silence(200), AnswerAudio(1))
    assert machine.state is State.SPEAKING
    assert drive(machine, UserResumed()) == [
        CancelAnswer(1, 1, "user_continued", clear=True, ends_turn=False, speculations=1, dropped=1, continues_as=2)]
    assert machine.state is State.USER_SPEAKING and not machine.released_early
    # the segment goes on, and its next likely final answers all of it
    assert drive(machine, UserLikelyFinal("Call my sister and tell her I'm late.")) == [
        StartAnswer(2, 2, "Call my sister and tell her I'm late.", held=True)]


def test_speech_soon_after_an_early_released_segment_ends_continues_its_turn():
    machine = TurnTaking(TurnTakingConfig(continuation_ms=1200))
    drive(machine, UserSpeechStarted(0), UserLikelyFinal("Call my sister."), LikelyVerdict(0.9), LmTurnVerdict(1, 0.9))
    drive(machine, Silence(200), AnswerAudio(1), UserSpeechEnded(1000), UserFinal("Call my sister."))
    assert drive(machine, UserSpeechStarted(1500), UserWords()) == [
        PauseOutput(1, 1),
        CancelAnswer(1, 1, "user_continued", clear=True, ends_turn=False, speculations=1, dropped=1, continues_as=2)]


def test_a_final_that_differs_from_the_likely_one_replaces_its_answer():
    machine = TurnTaking()
    drive(machine, UserSpeechStarted(0), UserLikelyFinal("Play some"))
    actions = drive(machine, UserSpeechEnded(900), UserFinal("Play some music"))
    assert actions == [
        CancelAnswer(1, 1, "transcript_changed", clear=False, ends_turn=False, speculations=1, dropped=1),
        StartAnswer(2, 1, "Play some music", held=True),
    ]
    assert machine.state is State.USER_PAUSED


def test_a_later_segment_of_the_turn_answers_all_of_it_from_its_likely_final():
    machine = TurnTaking()
    drive(machine, *segment(0, 800, "I was wondering."))  # answer 1, held
    continued = drive(machine, UserSpeechStarted(1200))
    assert [type(a) for a in continued] == [CancelAnswer]
    start = drive(machine, UserLikelyFinal("What will the weather be like?"))
    assert start == [StartAnswer(2, 1, "I was wondering. What will the weather be like?", held=True)]
    assert drive(machine, UserSpeechEnded(3000), UserFinal("What will the weather be like?")) == []


def test_the_likely_final_waits_for_the_end_of_a_file_turn_or_without_speculation():
    for config in (TurnTakingConfig(early_answer=False), TurnTakingConfig()):
        machine = TurnTaking(config)
        drive(machine, UserSpeechStarted(0))
        if config.early_answer:
            drive(machine, UserDone())  # the caller knows the turn ends here: the final starts it, released
            assert drive(machine, UserLikelyFinal("Hello")) == []
            assert drive(machine, UserSpeechEnded(500), UserFinal("Hello")) == [StartAnswer(1, 1, "Hello", held=False)]
        else:
            assert drive(machine, UserLikelyFinal("Hello")) == []


def test_words_that_trail_off_wait_as_long_as_an_unfinished_verdict():
    config = TurnTakingConfig(silence_rule_ms=600, complete_silence_ms=200, incomplete_silence_ms=1500)
    cases = (("Should I take the", True), ("My brother and I...", True), ("So I was thinking about", None))
    for text, verdict in cases:
        machine = TurnTaking(config)
        drive(machine, *segment(0, 800, text))
        if verdict is not None:
            drive(machine, TurnVerdict(verdict))
        assert drive(machine, Silence(1400)) == [], text  # past the complete and the silence rules
        assert drive(machine, Silence(1500)) == [ReleaseAnswer(1)], text
    finished = TurnTaking(config)
    drive(finished, *segment(0, 800, "Should I take the bus?"), TurnVerdict(True))
    assert drive(finished, Silence(200)) == [ReleaseAnswer(1)]


def test_a_question_heard_as_unfinished_waits_less_than_other_unfinished_words():
    config = TurnTakingConfig(complete_silence_ms=200, incomplete_silence_ms=1500, question_silence_ms=800)
    for text, needed in (("Can you recommend a good book?", 800), ("So what?", 1500), ("I was wondering.", 1500),
                         ("Could you tell me...?", 1500)):
        machine = TurnTaking(config)
        drive(machine, *segment(0, 800, text), TurnVerdict(False))
        assert drive(machine, Silence(needed - 10)) == [], text
        assert drive(machine, Silence(needed)) == [ReleaseAnswer(1)], text


def test_a_final_that_differs_from_the_likely_one_only_in_punctuation_keeps_its_answer():
    machine = TurnTaking()
    drive(machine, UserSpeechStarted(0), UserLikelyFinal("what time is it"))
    assert drive(machine, UserSpeechEnded(900), UserFinal("What time is it?")) == []
