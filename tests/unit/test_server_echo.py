"""The echo canceller's session shell (voice/listen/own_voice.py) as `/ws` uses it: a client's microphone at its own
rate, the session's audio at the output rate, and what a turn's stats say of the canceller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soxr

from voice import events as ev
from voice.audio import load_audio_16k
from voice.listen.own_voice import ECHO_RATE, OwnVoice

DATA = Path("/usr/share/pocketsphinx/test/data/librivox")
FAR_CLIPS = [DATA / f"sense_and_sensibility_01_austen_64kb-{n}.wav" for n in ("0870", "0890")]
OUT_RATE = 22_050  # the session's voice


def room(x: np.ndarray) -> np.ndarray:
    """120 ms late, a decaying tail, -8 dB: what a laptop's microphone hears of its speakers."""
    rng = np.random.default_rng(0)
    n = int(0.25 * ECHO_RATE)
    tail = rng.standard_normal(n) * np.exp(-np.arange(n) / (0.05 * ECHO_RATE))
    tail[0] = 3.0
    impulse = np.concatenate([np.zeros(int(0.12 * ECHO_RATE)), tail / np.sqrt(np.sum(tail**2))]) * 10 ** (-8 / 20)
    return np.convolve(x, impulse)[: len(x)].astype(np.float32)


def pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def far() -> np.ndarray:
    if not all(p.is_file() for p in FAR_CLIPS):
        pytest.skip("pocketsphinx-testdata is not installed")
    return np.concatenate([load_audio_16k(p) for p in FAR_CLIPS])


def test_a_client_at_48_khz_is_cancelled_and_heard_at_16_khz(far: np.ndarray) -> None:
    echo = OwnVoice(OUT_RATE)
    voice = soxr.resample(far, ECHO_RATE, OUT_RATE).astype(np.float32)
    echo.on_event(ev.AudioOut(session="s", turn=1, pcm=pcm16(voice), sample_rate=OUT_RATE, phrase_id=0))
    echo.played(1, 0)  # the client starts playing as its microphone starts sending
    mic = soxr.resample(room(far), ECHO_RATE, 48_000).astype(np.float32)
    chunk = 960  # 20 ms at 48 kHz
    cleaned = b"".join(echo.mic(pcm16(mic[at : at + chunk]), 48_000) for at in range(0, len(mic), chunk))
    out = np.frombuffer(cleaned, "<i2").astype(np.float32) / 32768
    assert 0 <= len(far) - len(out) < 0.05 * ECHO_RATE  # 16 kHz out (less what the resampler's filter holds back)
    settled = slice(2 * ECHO_RATE, len(out))
    kept = room(far)[: len(out)]
    assert 10 * np.log10(np.mean(kept[settled] ** 2) / np.mean(out[settled] ** 2)) > 15


def test_a_turns_stats_say_when_the_canceller_fell_back_to_half_duplex() -> None:
    echo = OwnVoice(OUT_RATE)
    end = ev.TurnEnd(session="s", turn=1, user_text="", answer="", spoken="", interrupted=False, latency_ms={},
                     stats={"lm_tokens": 3.0})
    assert echo.on_event(end).stats["echo_half_duplex"] == 0.0
    echo.canceller.half_duplex = True  # what EchoCanceller does once its frames overrun their budget
    stats = echo.on_event(end).stats
    assert stats["echo_half_duplex"] == 1.0 and stats["lm_tokens"] == 3.0


def test_local_mode_places_the_speaker_by_its_dac_times_and_cancels_it(far: np.ndarray) -> None:
    """Local mode's alignment: microphone blocks come with their ADC times and speaker blocks report when they reach
    the DAC, on one clock; the speaker starts 0.37 s after the microphone and its reports are the only anchor."""
    echo = OwnVoice(OUT_RATE)
    voice = soxr.resample(far, ECHO_RATE, OUT_RATE).astype(np.float32)
    echo.on_event(ev.AudioOut(session="s", turn=1, pcm=pcm16(voice), sample_rate=OUT_RATE, phrase_id=0))
    starts_at, t0 = 0.37, 1000.0  # the speaker's first sample reaches the DAC at t0 + 0.37 s
    lead = int(starts_at * ECHO_RATE)
    heard = np.concatenate([np.zeros(lead, np.float32), room(far)])  # the room, on the microphone's clock
    block, out_block = 320, 441  # 20 ms of microphone at 16 kHz, of speaker at 22.05 kHz
    cleaned, reported = [], 0
    for at in range(0, len(heard), block):
        now = t0 + at / ECHO_RATE
        while reported < len(voice) and t0 + starts_at + reported / OUT_RATE < now + 0.02:  # the speaker callback
            echo.played(1, reported, at=echo.position_at(t0 + starts_at + reported / OUT_RATE))
            reported += out_block
        cleaned.append(echo.mic(pcm16(heard[at : at + block]), ECHO_RATE, captured_at=now))
    out = np.frombuffer(b"".join(cleaned), "<i2").astype(np.float32) / 32768
    settled = slice(lead + 2 * ECHO_RATE, len(out))
    assert 10 * np.log10(np.mean(heard[settled] ** 2) / np.mean(out[settled] ** 2)) > 15
    assert echo.position_at(t0 + 1.0) == ECHO_RATE  # one second after the first block's capture


def test_a_reference_placed_a_quarter_second_off_cancels_nothing_much(far: np.ndarray) -> None:
    """The check above can fail: the same run with the speaker's reports 250 ms late (a misreported DAC time) removes
    far less, which is what local mode's alignment check (MIN_ERLE_DB) falls back to half duplex on."""
    echo = OwnVoice(OUT_RATE)
    voice = soxr.resample(far, ECHO_RATE, OUT_RATE).astype(np.float32)
    echo.on_event(ev.AudioOut(session="s", turn=1, pcm=pcm16(voice), sample_rate=OUT_RATE, phrase_id=0))
    echo.mic(b"", ECHO_RATE, captured_at=1000.0)
    echo.played(1, 0, at=echo.position_at(1000.25))  # the speaker really starts at 1000.0
    heard = room(far)
    cleaned = b"".join(echo.mic(pcm16(heard[at : at + 320]), ECHO_RATE) for at in range(0, len(heard), 320))
    out = np.frombuffer(cleaned, "<i2").astype(np.float32) / 32768
    settled = slice(2 * ECHO_RATE, len(out))
    assert 10 * np.log10(np.mean(heard[settled] ** 2) / np.mean(out[settled] ** 2)) < 10
