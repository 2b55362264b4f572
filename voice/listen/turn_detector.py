"""Semantic end of turn: has the user finished, or only paused? Smart Turn v3.2 plus a silence policy around it.

A silence rule alone cannot tell "I'd like to book a table for... [thinks] ...four people" from a finished question,
so it either cuts people off mid-thought (short timeout) or answers late (long timeout). Smart Turn v3.2 (BSD-2-Clause,
by Daily) is an 8.7 MB audio classifier that hears intonation and phrasing in the last 8 s of the utterance and returns
the probability that the turn is complete. With it the turn can end after a short silence when the user sounds done and
wait longer when they do not.

The ONNX file ships inside the PyPI wheel `pipecat-ai==1.14.0`, installed with `--no-deps` (its dependency tree is
large and we need only this file). Pipecat is never imported — its `__init__` needs those dependencies — the file is
found through `importlib.util.find_spec`.

Model input, as the model was trained (pipecat's `LocalSmartTurnAnalyzerV3`): 16 kHz mono; the last 8 s, zero-padded
at the front when shorter; zero-mean unit-variance normalisation of those 128,000 samples; Whisper's 80-bin log-mel
features (n_fft 400, hop 160, 800 frames) as `input_features` [batch, 80, 800]. Output `logits` [batch, 1] is already a
sigmoid probability.

`SmartTurn` is audio in, probability out. How long a pause must be for each verdict (the end-of-turn rule) lives in
one place, the turn-taking core (`voice.turn.machine.TurnTaking`), with the session's other transitions.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from model.process import watch
from voice.audio import check_float32_mono
from voice.errors import AudioFormatError, VoiceError

SAMPLE_RATE = 16_000
MODEL_PACKAGE = "pipecat"  # from the wheel pipecat-ai==1.14.0
MODEL_FILE = Path("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")
WINDOW_SECONDS = 8  # the model's input is always 800 frames of 10 ms
N_FFT = 400
HOP = 160
N_MELS = 80
N_FRAMES = WINDOW_SECONDS * SAMPLE_RATE // HOP  # 800
_NORM_EPS = 1e-7  # as transformers' WhisperFeatureExtractor, which the model was trained with


class TurnDetectorError(VoiceError):
    """The turn detector cannot run: model missing or corrupt, or audio it cannot judge."""

    code = "turn_detector_failed"


# --- features ------------------------------------------------------------------------------------------------------


def _slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (linear below 1 kHz, logarithmic above), which Whisper's filterbank uses."""
    return np.where(hz < 1000.0, 3.0 * hz / 200.0, 15.0 + np.log(np.maximum(hz, 1000.0) / 1000.0) * 27.0 / np.log(6.4))


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0))


def _mel_filterbank() -> np.ndarray:
    """Triangular filters, area-normalised: [N_MELS, N_FFT // 2 + 1], 0 Hz to Nyquist."""
    fft_hz = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = _slaney_hz(np.linspace(_slaney_mel(np.array(0.0)), _slaney_mel(np.array(SAMPLE_RATE / 2)), N_MELS + 2))
    lower, center, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (fft_hz[None, :] - lower) / (center - lower)
    falling = (upper - fft_hz[None, :]) / (upper - center)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return triangles * (2.0 / (upper - lower))


_MEL_FILTERS = _mel_filterbank()  # [80, 201]
_HANN = np.hanning(N_FFT + 1)[:-1]  # periodic, as torch.hann_window


def model_window(audio_16k: np.ndarray, max_seconds: float = WINDOW_SECONDS) -> np.ndarray:
    """The last `max_seconds` of `audio_16k`, zero-padded at the front to exactly 8 s (128,000 samples).

    The end of the utterance is what tells whether it is finished, so the front is what gets dropped or padded."""
    keep = round(max_seconds * SAMPLE_RATE)
    tail = audio_16k[-keep:]
    window = np.zeros(WINDOW_SECONDS * SAMPLE_RATE, dtype=np.float32)
    window[window.size - tail.size :] = tail
    return window


def log_mel_features(window: np.ndarray) -> np.ndarray:
    """Whisper log-mel features of one 8 s window: [80, 800] float32, after zero-mean unit-variance normalisation.

    Normalisation makes the verdict independent of the microphone's gain. The STFT is centred (reflect padding), which
    gives 801 frames; the last is dropped, as Whisper does."""
    if window.shape != (WINDOW_SECONDS * SAMPLE_RATE,):
        raise TurnDetectorError(f"a model window is {WINDOW_SECONDS * SAMPLE_RATE} samples, got shape {window.shape}")
    # float32 here, as the reference normalises its float32 buffer; the spectrum is then computed in float64
    normalised = (window - window.mean()) / np.sqrt(window.var() + _NORM_EPS)
    padded = np.pad(normalised.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]  # [801, 400]
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2  # [801, 201]
    log_mel = np.log10(np.maximum(_MEL_FILTERS @ power.T, 1e-10))[:, :N_FRAMES]  # [80, 800]
    log_mel = np.maximum(log_mel, log_mel.max() - 8.0)  # 80 dB dynamic range
    return ((log_mel + 4.0) / 4.0).astype(np.float32)


# --- the model -----------------------------------------------------------------------------------------------------


def find_smart_turn_model() -> Path | None:
    """The packaged Smart Turn v3.2 ONNX file, or None when the wheel `pipecat-ai` is not installed.

    None (not an exception) because a missing detector is a normal configuration: callers fall back to the silence
    rule."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / MODEL_FILE
        if path.is_file():
            return path
    return None


@dataclass(frozen=True, slots=True)
class TurnDetectorConfig:
    """`model_path` None means the file packaged in pipecat-ai; `threshold` on the complete-probability (the model's
    own 0.5); `max_seconds` of audio the model hears (at most its 8 s window); `threads` 1 so it never competes with
    the ASR and the LM for the other core (one call costs about 50 ms of CPU on a 2-core AMD EPYC Zen 4)."""

    model_path: Path | None = None
    threshold: float = 0.5
    max_seconds: float = WINDOW_SECONDS
    threads: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {self.threshold}")
        if not 0.0 < self.max_seconds <= WINDOW_SECONDS:
            raise ValueError(f"max_seconds must be in (0, {WINDOW_SECONDS}], got {self.max_seconds}")
        if self.threads < 1:
            raise ValueError("threads must be at least 1")


class OnnxSession(Protocol):
    """What `SmartTurn` asks of an `onnxruntime.InferenceSession`: one run, its outputs in order."""

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray], /) -> Sequence[object]: ...


class SmartTurn:
    """A loaded Smart Turn v3.2 model. Thread-safe: ONNX Runtime sessions may run concurrently, and no state is kept
    between calls (each call judges the audio it is given)."""

    def __init__(self, session: OnnxSession, config: TurnDetectorConfig) -> None:
        self._session = session
        self.config = config

    @classmethod
    def load(cls, config: TurnDetectorConfig = TurnDetectorConfig()) -> SmartTurn:
        """Load the model `config` names; `TurnDetectorError` when it is missing, corrupt or not Smart Turn's shape."""
        import onnxruntime
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

        path = config.model_path if config.model_path is not None else find_smart_turn_model()
        if path is None:
            raise TurnDetectorError(
                "Smart Turn model not found: install the wheel with `pip install --no-deps pipecat-ai==1.14.0` "
                "(`make install` does), or run without the turn detector (silence rule)"
            )
        if not Path(path).is_file():
            raise TurnDetectorError(f"Smart Turn model not found: {path}")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = config.threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        try:
            session = onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        except (ort_errors.Fail, ort_errors.InvalidGraph, ort_errors.InvalidProtobuf, ort_errors.NoSuchFile) as error:
            message = f"Smart Turn model {path} could not be loaded (corrupt or not ONNX): {error}"
            raise TurnDetectorError(message) from error
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if len(inputs) != 1 or inputs[0].name != "input_features" or list(inputs[0].shape[1:]) != [N_MELS, N_FRAMES]:
            found = [(i.name, i.shape) for i in inputs]
            message = f"{path} is not Smart Turn v3: expected input_features [batch, 80, 800], got {found}"
            raise TurnDetectorError(message)
        if len(outputs) != 1 or list(outputs[0].shape[1:]) != [1]:
            raise TurnDetectorError(f"{path} is not Smart Turn v3: expected one [batch, 1] output")
        return cls(session, config)

    def probability(self, audio_16k: np.ndarray) -> float:
        """Probability that the turn is complete, judged on the end of `audio_16k` (16 kHz mono float32, the turn's
        audio up to now, trailing silence included). Raises `TurnDetectorError` for audio it cannot judge."""
        _check_audio(audio_16k)
        with watch.span(watch.SMART_TURN):
            features = log_mel_features(model_window(audio_16k, self.config.max_seconds))[None]  # [1, 80, 800]
            (logits,) = self._session.run(None, {"input_features": features})
        return float(np.asarray(logits).reshape(-1)[0])

    def is_complete(self, audio_16k: np.ndarray) -> bool:
        """Whether the turn sounds finished (probability above the configured threshold)."""
        return self.probability(audio_16k) > self.config.threshold


def _check_audio(audio: np.ndarray) -> None:
    check_float32_mono(audio, "audio")
    if audio.size == 0:
        raise AudioFormatError("audio is empty: there is nothing to judge")


def load_turn_detector(config: TurnDetectorConfig = TurnDetectorConfig()) -> SmartTurn | None:
    """The detector, or None when the packaged model is not installed, so callers fall back to the silence rule.

    An explicit `model_path` that is missing, or a model file that is corrupt, is still an error: that is a broken
    configuration, not a missing option."""
    if config.model_path is None and find_smart_turn_model() is None:
        return None
    return SmartTurn.load(config)
