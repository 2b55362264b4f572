"""Silero voice activity detection on 16 kHz audio, from the ONNX model that ships inside faster-whisper (no download).

The v6 model takes 512-sample windows (32 ms) prefixed by the last 64 samples of the previous window, and carries an
LSTM state (h, c) from window to window; faster-whisper's own `SileroVADModel` feeds it the same way in batch. Here the
state is kept per stream so that one loaded model (`onnxruntime.InferenceSession`, thread-safe for `run`) serves every
session, and audio can arrive in chunks of any size.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from voice.audio import TARGET_RATE
from voice.errors import ASRError
from voice.listen.whisper_import import import_faster_whisper

FRAME_SAMPLES = 512
CONTEXT_SAMPLES = 64
STATE_SHAPE = (1, 1, 128)


def silero_model_path() -> str:
    """Where faster-whisper keeps the Silero VAD v6 model."""
    faster_whisper = import_faster_whisper()
    return os.path.join(os.path.dirname(faster_whisper.__file__), "assets", "silero_vad_v6.onnx")


@functools.cache
def load_silero_session():  # -> onnxruntime.InferenceSession
    """Load the model once per process: one thread per call, since a 32 ms window is far too small to split."""
    import onnxruntime

    path = silero_model_path()
    if not os.path.isfile(path):
        raise ASRError(f"Silero VAD model not found at {path}; is faster-whisper installed?")
    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"], sess_options=options)


class SileroVad:
    """Speech probability per 32 ms window for one audio stream. Feed 16 kHz mono float32 in chunks of any size."""

    frame_samples = FRAME_SAMPLES
    sample_rate = TARGET_RATE

    def __init__(self) -> None:
        self._session = load_silero_session()
        self.reset()

    def reset(self) -> None:
        """Forget the stream: recurrent state, context and any partial window."""
        self._h = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)

    def push(self, samples: np.ndarray) -> list[float]:
        """Append samples; return the speech probability of every window completed by them, in order."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1:
            raise ASRError(f"VAD expects mono audio, got shape {samples.shape}")
        self._pending = np.concatenate([self._pending, samples]) if self._pending.size else samples
        probabilities = []
        while self._pending.size >= FRAME_SAMPLES:
            window, self._pending = self._pending[:FRAME_SAMPLES], self._pending[FRAME_SAMPLES:]
            probabilities.append(self._window_probability(window))
        return probabilities

    def _window_probability(self, window: np.ndarray) -> float:
        model_input = np.concatenate([self._context, window])[None, :]  # [1, 576]
        probability, self._h, self._c = self._session.run(None, {"input": model_input, "h": self._h, "c": self._c})
        self._context = window[-CONTEXT_SAMPLES:].copy()
        return float(np.asarray(probability).reshape(-1)[0])
