"""Endpointer decisions from synthetic speech-probability sequences (no model)."""

from __future__ import annotations

import pytest

from voice.listen.endpointer import Endpointer, EndpointerConfig

FRAME = 512
CONFIG = EndpointerConfig(threshold=0.5, min_speech_ms=96, min_silence_ms=320, speech_pad_ms=64)  # 3 frames start


def feed(endpointer: Endpointer, probabilities: list[float]) -> list[tuple[int, object]]:
    """Push probabilities; return (window index, decision) for every decision."""
    decisions = []
    for index, probability in enumerate(probabilities):
        decision = endpointer.push(probability)
        if decision is not None:
            decisions.append((index, decision))
    return decisions


def test_start_after_min_speech_and_end_after_min_silence():
    probs = [0.0] * 5 + [0.9] * 20 + [0.0] * 15
    decisions = feed(Endpointer(CONFIG), probs)
    assert [d.kind for _, d in decisions] == ["speech_start", "speech_end"]
    (start_index, start), (end_index, end) = decisions
    assert start.sample == 5 * FRAME  # first voiced sample, not when the decision was taken
    assert start_index == 7 and start.decided_at == 8 * FRAME  # 3 voiced windows = 96 ms
    assert start.audio_from == 5 * FRAME - 64 * 16
    assert end.sample == 25 * FRAME  # one past the last voiced sample
    assert end.audio_to == 25 * FRAME + 64 * 16
    # 320 ms = 10 windows of silence after the last voiced one
    assert end_index == 34 and end.decided_at - end.sample == 10 * FRAME


def test_blip_shorter_than_min_speech_is_ignored():
    probs = [0.0] * 3 + [0.95] * 2 + [0.0] * 30
    assert feed(Endpointer(CONFIG), probs) == []


def test_pause_shorter_than_min_silence_keeps_one_turn():
    probs = [0.9] * 10 + [0.0] * 8 + [0.9] * 10 + [0.0] * 12
    decisions = feed(Endpointer(CONFIG), probs)
    assert [d.kind for _, d in decisions] == ["speech_start", "speech_end"]
    assert decisions[1][1].sample == 28 * FRAME


def test_hysteresis_counts_soft_windows_as_voiced_while_speaking():
    # 0.4 is below threshold (0.5) but above the release threshold (0.35): it must not start the silence clock
    probs = [0.9] * 5 + [0.4] * 12 + [0.1] * 10
    decisions = feed(Endpointer(CONFIG), probs)
    assert [d.kind for _, d in decisions] == ["speech_start", "speech_end"]
    assert decisions[1][1].sample == 17 * FRAME


def test_soft_windows_alone_never_start_speech():
    assert feed(Endpointer(CONFIG), [0.4] * 50) == []


def test_two_utterances_give_two_turns_and_padding_is_clamped_at_zero():
    probs = [0.9] * 6 + [0.0] * 12 + [0.8] * 6 + [0.0] * 12
    decisions = feed(Endpointer(CONFIG), probs)
    assert [d.kind for _, d in decisions] == ["speech_start", "speech_end"] * 2
    assert decisions[0][1].audio_from == 0
    assert decisions[2][1].sample == 18 * FRAME


def test_finish_closes_open_speech_without_trailing_silence():
    endpointer = Endpointer(CONFIG)
    feed(endpointer, [0.9] * 10)
    decision = endpointer.finish()
    assert decision is not None and decision.kind == "speech_end"
    assert decision.sample == 10 * FRAME and decision.audio_to == 10 * FRAME
    assert endpointer.finish() is None


def test_default_endpoint_delay_is_under_400_ms():
    config = EndpointerConfig()
    decisions = feed(Endpointer(config), [0.9] * 20 + [0.0] * 40)
    end = decisions[-1][1]
    delay_ms = (end.decided_at - end.sample) * 1000 / config.sample_rate
    assert 300 <= delay_ms <= 400


@pytest.mark.parametrize(
    "kwargs",
    [{"threshold": 1.5}, {"neg_threshold": 0.9}, {"min_silence_ms": -1}, {"speech_pad_ms": 500, "min_silence_ms": 300}],
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(ValueError):
        EndpointerConfig(**kwargs)
