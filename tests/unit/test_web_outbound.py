"""The outbound queue without sockets or clocks: control first, speech paced near real time, `clear` drops a turn's
audio, both lanes bounded."""

from __future__ import annotations

import pytest

from web.outbound import ClientTooSlow, OutboundLimits, OutboundQueue
from web.protocol import LimitExceeded

RATE = 1000  # samples per second: a 100 ms frame is 100 samples, 200 bytes
FRAME = b"\x00\x01" * 100


def drain(queue: OutboundQueue, now: float) -> list[str | bytes]:
    sent = []
    while (frame := queue.pop(now)) is not None:
        sent.append(frame)
    return sent


def speak(queue: OutboundQueue, turn: int, frames: int) -> None:
    queue.push_audio_marker(f"start{turn}", turn, RATE)
    for _ in range(frames):
        assert queue.push_audio(FRAME, turn) is None
    queue.push_audio_marker(f"end{turn}", turn)


def test_audio_is_paced_to_real_time_plus_the_lead() -> None:
    queue = OutboundQueue(OutboundLimits(lead_s=0.5), RATE)
    speak(queue, 1, frames=30)  # 3 s of speech, ready at once (TTS is faster than real time)
    first = drain(queue, now=0.0)
    assert first[0] == "start1" and first.count(FRAME) == 6  # 0.6 s: sent while the client holds <= 0.5 s
    assert queue.wait_s(0.0) == pytest.approx(0.1)
    assert drain(queue, now=0.5).count(FRAME) == 5  # half a second played, half a second more
    rest = [frame for now in (1.0, 1.5, 2.0, 2.5) for frame in drain(queue, now)]
    assert rest.count(FRAME) == 19 and rest[-1] == "end1"
    assert queue.wait_s(10.0) == float("inf") and queue.queued_audio_s == pytest.approx(0.0)


def test_a_gap_in_the_speech_restarts_the_playback_clock() -> None:
    queue = OutboundQueue(OutboundLimits(lead_s=0.0), RATE)
    queue.push_audio_marker("start1", 1, RATE)
    queue.push_audio(FRAME, 1)
    assert drain(queue, now=0.0) == ["start1", FRAME]
    queue.push_audio(FRAME, 1)
    queue.push_audio(FRAME, 1)
    # the TTS was late: the client's 0.1 s ran out at t=0.1, so at t=5 the next frame goes at once, not 4.9 s early
    assert drain(queue, now=5.0) == [FRAME]
    assert queue.wait_s(5.0) == pytest.approx(0.1)


def test_control_messages_overtake_queued_audio() -> None:
    queue = OutboundQueue(OutboundLimits(lead_s=0.0), RATE)
    speak(queue, 1, frames=10)
    assert drain(queue, now=0.0) == ["start1", FRAME]
    queue.push_control("answer")
    queue.push_control("turn_end")
    assert queue.pop(0.01) == "answer" and queue.pop(0.01) == "turn_end" and queue.pop(0.01) is None


def test_clear_drops_the_turns_audio_and_nothing_of_it_is_sent_afterwards() -> None:
    queue = OutboundQueue(OutboundLimits(lead_s=0.0), RATE)
    speak(queue, 1, frames=10)
    assert drain(queue, now=0.0) == ["start1", FRAME]
    queue.push_clear("clear1", 1)
    assert queue.push_audio(FRAME, 1) is None  # still arriving from the cancelled turn
    queue.push_audio_marker("end1", 1)
    assert drain(queue, now=100.0) == ["clear1"]
    assert queue.dropped_audio_s == pytest.approx(0.9)  # what was queued, not yet sent
    speak(queue, 2, frames=2)  # the next turn speaks normally
    assert drain(queue, now=100.0) == ["start2", FRAME]
    assert drain(queue, now=101.0) == [FRAME, "end2"]


def test_pause_holds_the_audio_and_its_pacing_clock_until_resume() -> None:
    queue = OutboundQueue(OutboundLimits(lead_s=0.0), RATE)
    speak(queue, 1, frames=10)
    assert drain(queue, now=0.0) == ["start1", FRAME]
    queue.push_pause("pause1", 1, now=0.05)  # the client stops playing half-way through its 0.1 s
    assert drain(queue, now=5.0) == ["pause1"]  # nothing more while paused, however long
    assert queue.wait_s(5.0) == float("inf")
    queue.push_resume("resume1", 1, now=5.0)
    assert drain(queue, now=5.0) == ["resume1"]  # the client still holds 0.05 s: the clock did not run in the pause
    assert drain(queue, now=5.06) == [FRAME]


def test_clear_ends_a_pause() -> None:
    queue = OutboundQueue(OutboundLimits(lead_s=0.0), RATE)
    speak(queue, 1, frames=3)
    drain(queue, now=0.0)
    queue.push_pause("pause1", 1, now=0.0)
    queue.push_clear("clear1", 1)
    speak(queue, 2, frames=1)
    assert drain(queue, now=1.0) == ["pause1", "clear1", "start2", FRAME, "end2"]


def test_the_audio_lane_is_bounded_in_seconds_with_one_notice_per_turn() -> None:
    queue = OutboundQueue(OutboundLimits(max_audio_s=1.0, lead_s=0.0), RATE)
    notices = [queue.push_audio(FRAME, 1) for _ in range(15)]
    assert notices[:10] == [None] * 10
    assert isinstance(notices[10], LimitExceeded) and "1 s of speech" in str(notices[10])
    assert notices[11:] == [None] * 4
    assert queue.queued_audio_s == pytest.approx(1.0) and queue.dropped_audio_s == pytest.approx(0.5)


def test_a_client_that_reads_nothing_fills_the_control_lane_and_is_refused() -> None:
    queue = OutboundQueue(OutboundLimits(max_control_messages=3), RATE)
    for index in range(3):
        queue.push_control(str(index))
    with pytest.raises(ClientTooSlow, match="not reading"):
        queue.push_control("one too many")
    assert queue.queued_control == 3
