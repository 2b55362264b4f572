"""Semantic end of turn without the model: input checks, the model window, and the Whisper features against the
reference implementation that ships in the same wheel as the model. (The end-of-turn rule is the turn-taking core's:
tests/unit/test_turn_taking.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import voice.listen.turn_detector as turn_detector
from voice.errors import AudioFormatError
from voice.listen.turn_detector import (
    SmartTurn,
    TurnDetectorConfig,
    TurnDetectorError,
    find_smart_turn_model,
    load_turn_detector,
    log_mel_features,
    model_window,
)

# --- detector shell with a fake session ----------------------------------------------------------------------------


class FakeSession:
    """Stands in for the ONNX session: records what it was given, answers a fixed probability."""

    def __init__(self, probability: float) -> None:
        self.probability = probability
        self.inputs: list[np.ndarray] = []

    def run(self, _outputs: object, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.inputs.append(feeds["input_features"])
        return [np.array([[self.probability]], dtype=np.float32)]


def test_probability_feeds_one_80_by_800_float32_batch() -> None:
    session = FakeSession(0.7)
    detector = SmartTurn(session, TurnDetectorConfig())
    assert detector.probability(np.full(16_000, 0.1, dtype=np.float32)) == pytest.approx(0.7)
    assert detector.is_complete(np.zeros(16_000, dtype=np.float32))
    assert session.inputs[0].shape == (1, 80, 800)
    assert session.inputs[0].dtype == np.float32


def test_threshold_decides_is_complete() -> None:
    audio = np.zeros(1600, dtype=np.float32)
    assert not SmartTurn(FakeSession(0.6), TurnDetectorConfig(threshold=0.8)).is_complete(audio)
    assert SmartTurn(FakeSession(0.6), TurnDetectorConfig(threshold=0.5)).is_complete(audio)


@pytest.mark.parametrize(
    ("audio", "message"),
    [
        (np.zeros((2, 1600), dtype=np.float32), "1-D"),
        (np.zeros(1600, dtype=np.float64), "float32"),
        (np.zeros(1600, dtype=np.int16), "float32"),
        (np.zeros(0, dtype=np.float32), "empty"),
        (np.array([0.0, np.nan, 0.1], dtype=np.float32), "NaN"),
        (np.array([0.0, np.inf], dtype=np.float32), "NaN or infinite"),
        ([0.0, 0.1], "numpy array"),
    ],
)
def test_bad_audio_is_a_clear_typed_error(audio: np.ndarray, message: str) -> None:
    session = FakeSession(0.5)
    with pytest.raises(AudioFormatError, match=message):
        SmartTurn(session, TurnDetectorConfig()).probability(audio)
    assert session.inputs == []


def test_model_window_pads_the_front_and_keeps_the_last_8_s() -> None:
    short = np.arange(1, 16_001, dtype=np.float32)
    window = model_window(short)
    assert window.shape == (128_000,)
    assert not window[:112_000].any()
    assert np.array_equal(window[112_000:], short)

    long = np.arange(200_000, dtype=np.float32)
    assert np.array_equal(model_window(long), long[-128_000:])

    two_seconds = model_window(long, max_seconds=2.0)
    assert not two_seconds[:96_000].any()
    assert np.array_equal(two_seconds[96_000:], long[-32_000:])


def test_detector_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        TurnDetectorConfig(threshold=1.0)
    with pytest.raises(ValueError):
        TurnDetectorConfig(max_seconds=9.0)
    with pytest.raises(ValueError):
        TurnDetectorConfig(threads=0)


def test_without_the_wheel_callers_get_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turn_detector.importlib.util, "find_spec", lambda _name: None)
    assert find_smart_turn_model() is None
    assert load_turn_detector() is None
    with pytest.raises(TurnDetectorError, match=r"pip install --no-deps pipecat-ai==1\.14\.0"):
        SmartTurn.load()


def test_missing_or_corrupt_explicit_model_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TurnDetectorError, match="not found"):
        load_turn_detector(TurnDetectorConfig(model_path=tmp_path / "absent.onnx"))
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"not an onnx model")
    with pytest.raises(TurnDetectorError, match="could not be loaded"):
        SmartTurn.load(TurnDetectorConfig(model_path=corrupt))


# --- features against the wheel's reference ------------------------------------------------------------------------


def reference_features():  # -> the wheel's compute_whisper_log_mel_features
    """Load pipecat's numpy-only feature code by file path: importing `pipecat` itself needs packages we skip."""
    model = find_smart_turn_model()
    if model is None:
        pytest.skip("pipecat-ai==1.14.0 is not installed (make install)")
    path = model.parent.parent / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("smart_turn_reference_features", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_whisper_log_mel_features


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """Harmonics with a syllable-rate envelope, plus noise and a silent gap: a spectrum with structure and a range
    wide enough for the 80 dB clamp to matter."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16_000)) / 16_000
    voice = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12))
    envelope = np.clip(np.sin(2 * np.pi * 3.1 * t), 0, None)
    audio = 0.2 * voice * envelope + 0.01 * rng.standard_normal(t.size)
    audio[len(audio) // 3 : len(audio) // 3 + 4000] = 0.0
    return audio.astype(np.float32)


@pytest.mark.parametrize("seconds", [0.5, 3.0, 8.0, 11.5])
def test_features_equal_the_reference(seconds: float) -> None:
    reference = reference_features()
    window = model_window(speech_like(seconds, seed=int(seconds * 10)))
    ours = log_mel_features(window)
    theirs = reference(window, do_normalize=True)
    assert ours.shape == theirs.shape == (80, 800)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


def test_features_of_silence_are_finite() -> None:
    features = log_mel_features(model_window(np.zeros(100, dtype=np.float32)))
    assert np.all(np.isfinite(features))
