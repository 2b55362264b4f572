"""The echo canceller core and its playback timeline, on real recorded speech through a simulated room."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from voice.audio import load_audio_16k
from voice.listen.echo import FRAME, EchoCanceller, EchoConfig
from voice.listen.playback_timeline import PlaybackTimeline

DATA = Path("/usr/share/pocketsphinx/test/data")
FAR_CLIPS = [DATA / "librivox" / f"sense_and_sensibility_01_austen_64kb-{n}.wav" for n in ("0870", "0890", "0920")]
NEAR_RAW = DATA / "goforward.raw"  # another talker: "go forward ten meters"
R = 16_000


def room(delay_s: float = 0.12, gain_db: float = -8.0, seed: int = 0) -> np.ndarray:
    """A loudspeaker-to-microphone path: 120 ms late, a small room's decaying tail, `gain_db` in all."""
    rng = np.random.default_rng(seed)
    n = int(0.25 * R)
    tail = rng.standard_normal(n) * np.exp(-np.arange(n) / (0.05 * R))
    tail[0] = 3.0
    tail /= np.sqrt(np.sum(tail**2))
    return np.concatenate([np.zeros(int(delay_s * R)), tail]) * 10 ** (gain_db / 20)


@pytest.fixture(scope="module")
def speech() -> tuple[np.ndarray, np.ndarray]:
    if not all(p.is_file() for p in [*FAR_CLIPS, NEAR_RAW]):
        pytest.skip("pocketsphinx-testdata is not installed")
    far = np.concatenate([load_audio_16k(p) for p in FAR_CLIPS])
    near = np.frombuffer(NEAR_RAW.read_bytes(), "<i2").astype(np.float32) / 32768
    return far, near * np.sqrt(np.mean(far**2) / np.mean(near**2))  # the talker as loud as the far end


def erle_db(echo: np.ndarray, residual: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(echo**2) / np.mean(residual**2)))


def run(canceller: EchoCanceller, mic: np.ndarray, chunk: int = 320) -> np.ndarray:
    return np.concatenate([canceller.process(mic[at : at + chunk]) for at in range(0, len(mic), chunk)])


def test_cancels_a_delayed_decaying_echo_of_real_speech_by_more_than_20_db(speech):
    far, _ = speech
    echo = np.convolve(far, room())[: len(far)].astype(np.float32)
    noise = np.random.default_rng(1).standard_normal(len(far)).astype(np.float32) * 10 ** (-55 / 20)
    canceller = EchoCanceller()
    canceller.timeline.sent(1, far, mic_pos=0)
    canceller.timeline.played(1, 0, mic_pos=0)  # the client played sample 0 as the microphone stood at 0
    out = run(canceller, echo + noise)
    settled = slice(2 * R, len(out))  # AEC3 converges within the first two seconds
    assert erle_db(echo[settled], out[settled]) > 20
    assert canceller.stats()["echo_erle_db"] > 15
    # without the reference the same microphone keeps its echo: the figure is the canceller's, not the filters'
    blind = run(EchoCanceller(EchoConfig(noise_suppression=False)), echo + noise)
    assert erle_db(echo[settled], blind[settled]) < 3


def test_keeps_the_talkers_words_during_double_talk(speech):
    far, near = speech
    echo = np.convolve(far, room())[: len(far)].astype(np.float32)
    start = len(far) - len(near) - R
    talker = np.zeros(len(far), np.float32)
    talker[start : start + len(near)] = near * 10 ** (-8 / 20)  # as loud as the echo
    canceller = EchoCanceller()
    canceller.timeline.sent(1, far, mic_pos=0)
    canceller.timeline.played(1, 0, mic_pos=0)
    out = run(canceller, echo + talker)
    span = slice(start, start + len(near))
    # AEC3 works in sub-bands and does not keep the waveform's phase, so judge the talker by level and envelope
    assert 10 * np.log10(np.mean(out[span] ** 2) / np.mean(talker[span] ** 2)) > -8  # the voice is kept...
    assert np.corrcoef(envelope(out[span]), envelope(talker[span]))[0, 1] > 0.5  # ...and it is the talker's
    alone = slice(2 * R, start)  # far end alone: what is left of the echo, far below the talker
    assert erle_db(echo[alone], out[alone]) > 25


def envelope(x: np.ndarray, hop: int = 320) -> np.ndarray:
    """Log energy per 20 ms."""
    return np.log10(np.mean(x[: len(x) // hop * hop].reshape(-1, hop) ** 2, axis=1) + 1e-9)


def test_a_misplaced_reference_within_the_delay_estimators_reach_still_cancels(speech):
    far, _ = speech
    echo = np.convolve(far, room())[: len(far)].astype(np.float32)
    canceller = EchoCanceller()
    canceller.timeline.sent(1, far, mic_pos=0)
    canceller.timeline.played(1, 0, mic_pos=1600)  # the report says 100 ms later than the truth (a slow network)
    out = run(canceller, echo)
    settled = slice(3 * R, len(out))
    assert erle_db(echo[settled], out[settled]) > 15


def test_played_reports_anchor_the_turn_and_teach_the_next_turns_start():
    timeline = PlaybackTimeline()
    tone = np.ones(8000, np.float32)
    timeline.sent(1, tone, mic_pos=1000)
    assert timeline.reference(1000, 4)[0] == 1.0  # before any report: placed where it was sent
    timeline.played(1, 4000, mic_pos=8000)  # sample 4000 played as the microphone stood at 8000: offset 4000
    ref = timeline.reference(3990, 20)
    assert ref[:10].sum() == 0 and ref[10:].sum() == 10
    # the next turn is placed as turn 1 started (3000 samples after it was sent), less the margin that keeps a
    # reference early rather than late
    timeline.sent(2, tone, mic_pos=20_000)
    early = 3000 - timeline.config.early_margin_samples
    ref = timeline.reference(20_000 + early - 10, 20)
    assert ref[:10].sum() == 0 and ref[10:].sum() == 10
    timeline.played(2, 1000, mic_pos=24_000)
    timeline.played(2, 2000, mic_pos=25_010)  # a report 10 samples off (jitter, rounding) leaves the anchor
    assert timeline.reference(22_999, 1)[0] == 0 and timeline.reference(23_000, 1)[0] == 1
    timeline.played(2, 3000, mic_pos=27_000)  # 1000 samples off (the client's buffer ran dry): re-anchored
    assert timeline.reference(23_999, 1)[0] == 0 and timeline.reference(24_000, 1)[0] == 1


def test_a_new_turn_is_placed_by_the_earliest_of_the_last_turns_starts():
    timeline = PlaybackTimeline()
    margin = timeline.config.early_margin_samples
    for turn, latency in enumerate([3000, 1000, 2000], start=1):  # the link's start latency varies turn to turn
        sent_at = turn * 100_000
        timeline.sent(turn, np.ones(8000, np.float32), mic_pos=sent_at)
        timeline.played(turn, 500, mic_pos=sent_at + latency + 500)
    assert timeline.latency == 1000 - margin  # not the last one (2000): a reference late by 1000 cannot be cancelled
    timeline.sent(4, np.ones(8000, np.float32), mic_pos=400_000)
    assert timeline.reference(400_000 + 1000 - margin - 1, 2).tolist() == [0.0, 1.0]


def test_a_pause_stops_the_reference_where_the_client_says_and_resume_goes_on_from_there():
    timeline = PlaybackTimeline()
    ramp = np.arange(1, 16_001, dtype=np.float32)
    timeline.sent(1, ramp, mic_pos=0)
    timeline.played(1, 0, mic_pos=0)
    timeline.stopped(1, mic_pos=3000)
    timeline.played(1, 3500, mic_pos=3600)  # the report after the pause: 3500 samples played
    assert timeline.reference(3490, 20)[10:].sum() == 0  # nothing past sample 3500
    timeline.resumed(1, mic_pos=10_000)
    assert timeline.reference(10_000, 1)[0] == 3501  # sample 3500 plays next (latency 0)


def test_a_reference_that_stops_without_a_report_ends_after_the_slack_and_is_forgotten():
    timeline = PlaybackTimeline()
    timeline.sent(1, np.ones(32_000, np.float32), mic_pos=0)
    timeline.stopped(1, mic_pos=1000)  # cleared, and the client never reports again (gone)
    slack = timeline.config.stop_slack_samples
    assert timeline.reference(1000 + slack - 5, 10).sum() == 5
    assert not timeline.playing(100_000, FRAME)
    timeline.reference(100_000, FRAME)
    timeline.played(1, 500, mic_pos=100_000)  # a late report for a forgotten turn changes nothing
    assert timeline.reference(0, 1000).sum() == 0


def test_a_canceller_that_cannot_keep_up_mutes_while_the_voice_plays_and_says_so():
    ticks = iter(np.arange(0, 1e6, 0.006))  # every clock reading 6 ms later: each frame costs 6 ms > 5 ms budget
    canceller = EchoCanceller(clock=lambda: float(next(ticks)))
    canceller.timeline.sent(1, np.full(R, 0.1, np.float32), mic_pos=0)
    mic = np.full(3 * R, 0.2, np.float32)
    out = run(canceller, mic)
    assert canceller.half_duplex and canceller.stats()["echo_half_duplex"] == 1.0
    after = slice(100 * FRAME, R)  # muted from the budget window's end while the voice plays
    assert not out[after].any()
    assert np.allclose(out[2 * R :], 0.2)  # and heard again once it (and its echo tail) is over
