"""scripts/latency_report.py end to end: real models, real speech, two short turns; the JSON has every field, the
stages add up to voice-to-voice, the plots are real PNGs; bad input and an unreachable server fail in one line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from scripts.report_lib.report_math import LATENCY_FIELDS, MARK_FIELDS, SEGMENTS, STAT_FIELDS, SUMMARY_FIELDS
from voice.audio import load_audio_16k, resample
from voice.latency import STAGE_NAMES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "latency_report.py"
CLIP = Path("/usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav")
DEFAULT_ADAPTER = ROOT / "model" / "bundled" / "default" / "adapter.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {"count", "mean", "p50", "p90", "p95", "max"}
TURN_KEYS = {
    "index", "source", "transcript", "answer", "errors", "latency_ms", "marks_ms", "stats",
    "client_voice_to_voice", "stage_sum_ms", "segments_ms",
}


def _report(*args: str, timeout: float = 200.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not CLIP.is_file():
        pytest.skip("pocketsphinx-testdata not installed")
    folder = tmp_path_factory.mktemp("latency")
    # the second turn is the same speech as 44.1 kHz stereo: the report takes WAVs of any rate and channel count
    speech = resample(load_audio_16k(CLIP), 16000, 44100)
    stereo = folder / "stereo_44k.wav"
    soundfile.write(stereo, np.stack([speech, speech], axis=1), 44100, subtype="PCM_16")
    out = folder / "out"
    model: list[str] = []
    if not DEFAULT_ADAPTER.exists():  # the bundled model is being trained: a tiny random BERT runs the same code
        from scripts.report_lib.tiny_models import tiny_bert

        model = ["--model", str(tiny_bert(folder / "tiny-bert"))]
    done = _report(str(CLIP), str(stereo), "--turns", "2", "--no-realtime", "--no-warmup",
                   "--max-new-tokens", "12", "--trace", "--out", str(out), *model)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_json_has_every_field_for_every_turn_and_the_summary(report_dir: Path) -> None:
    report = json.loads((report_dir / "report.json").read_text())
    assert report["mode"] == "in-process"
    assert {"cpu", "cores", "memory_gib"} <= set(report["machine"])
    assert report["command"].startswith("python scripts/latency_report.py")
    (run,) = report["runs"]
    assert len(run["turns"]) == 2
    for turn in run["turns"]:
        assert set(turn) == TURN_KEYS
        assert set(turn["latency_ms"]) == set(LATENCY_FIELDS)
        assert set(turn["marks_ms"]) == set(MARK_FIELDS)
        assert set(turn["stats"]) == set(STAT_FIELDS)
        assert {"was", "young", "man"} <= set(turn["transcript"].lower().replace(".", "").split())
    for name in SUMMARY_FIELDS:
        assert set(run["summary"][name]) == SUMMARY_KEYS, name
    assert set(run["summary"]["speculation"]) == {"hits", "misses", "hit_rate", "saved_ms_total"}
    assert run["summary"]["turns"]["total"] == 2


def test_stage_durations_add_up_to_voice_to_voice(report_dir: Path) -> None:
    (run,) = json.loads((report_dir / "report.json").read_text())["runs"]
    spoken = [turn for turn in run["turns"] if turn["latency_ms"]["voice_to_voice"] is not None]
    assert spoken, f"no turn produced audio: {[turn['errors'] for turn in run['turns']]}"
    for turn in spoken:
        latency = turn["latency_ms"]
        assert all(latency[name] is not None and latency[name] >= 0 for name in STAGE_NAMES), latency
        assert sum(latency[name] for name in STAGE_NAMES) == pytest.approx(latency["voice_to_voice"], abs=1.0)
        assert sum(turn["segments_ms"].values()) == pytest.approx(latency["voice_to_voice"], abs=1.0)
        assert list(turn["segments_ms"]) == [key for key, _ in SEGMENTS]
        assert turn["marks_ms"]["at_first_audio_out"] == pytest.approx(latency["voice_to_voice"], abs=1.0)
        assert turn["stats"]["passes"] >= 1 and turn["stats"]["tokens_per_second"] is not None
    v2v = run["summary"]["voice_to_voice"]
    assert v2v["count"] == len(spoken) and v2v["p50"] <= v2v["p95"] <= v2v["max"]


def test_plots_are_valid_pngs_and_the_page_links_them(report_dir: Path) -> None:
    import matplotlib.image

    page = (report_dir / "report.md").read_text()
    for name in ("timeline.png", "voice_to_voice.png"):
        data = (report_dir / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000, name
        height, width = matplotlib.image.imread(report_dir / name).shape[:2]
        assert height > 200 and width > 300
        assert f"]({name})" in page
    assert "voice-to-voice" in page and "| p50 | p90 | p95 | max |" in page


def test_the_trace_times_each_model_call_of_the_turns(report_dir: Path) -> None:
    from scripts.report_lib.work_trace import ASR_PARTIAL, KINDS, LIKELY_FINAL, LM_PASS, TTS_RENDER

    trace = json.loads((report_dir / "trace.json").read_text())
    kinds = {interval["kind"] for interval in trace}
    assert kinds <= set(KINDS)
    assert {LM_PASS, TTS_RENDER} <= kinds and kinds & {LIKELY_FINAL, ASR_PARTIAL}  # two answered, spoken turns
    assert all(interval["end_ns"] >= interval["start_ns"] for interval in trace)
    starts = [interval["start_ns"] for interval in trace]
    assert starts == sorted(starts)
    work = {row["kind"]: row for row in json.loads((report_dir / "report.json").read_text())["work"]}
    assert work[LM_PASS]["calls"] == sum(g["calls"] for g in work[LM_PASS]["by_company"].values()) > 0
    assert "| LM pass |" in (report_dir / "trace.md").read_text()


def test_the_trace_refuses_a_comparison_in_one_line(tmp_path: Path) -> None:
    done = _report(str(CLIP), "--trace", "--compare", "--out", str(tmp_path / "out"), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--trace" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_input_that_is_not_audio_fails_in_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "notes.wav"
    fake.write_text("this is not audio\n")
    done = _report(str(fake), "--out", str(tmp_path / "out"), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "notes.wav" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_unreachable_server_fails_in_one_line(tmp_path: Path) -> None:
    if not CLIP.is_file():
        pytest.skip("pocketsphinx-testdata not installed")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = _report(str(CLIP), "--ws", f"ws://127.0.0.1:{port}/ws", "--out", str(tmp_path / "out"), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert f"cannot reach the voice server at ws://127.0.0.1:{port}/ws" in done.stderr


def test_the_conversational_turns_are_new_speech_half_of_it_with_a_pause_inside(tmp_path: Path) -> None:
    from model.training.teacher_data import assistant_questions
    from scripts.report_lib.inputs import CONVERSATIONAL, PAUSE_S, QUESTIONS, conversational_turns
    from scripts.report_lib.soak_inputs import SOAK_QUESTIONS

    spoken = {part for turn in CONVERSATIONAL for part in turn}
    assert not spoken & (set(QUESTIONS) | set(SOAK_QUESTIONS) | set(assistant_questions()))  # unseen elsewhere
    paths = conversational_turns(tmp_path)
    assert len(paths) == len(CONVERSATIONAL) == len(set(paths))
    for turn, path in zip(CONVERSATIONAL, paths, strict=True):
        audio = load_audio_16k(path)
        quiet = np.abs(audio) < 1e-3
        run = longest = 0
        for silent in quiet[int(0.5 * 16000):]:  # after the lead-in
            run = run + 1 if silent else 0
            longest = max(longest, run)
        trailing = len(quiet) - np.flatnonzero(~quiet)[-1] - 1  # Piper's own silence after the speech
        inside = longest > trailing and longest >= int(0.9 * PAUSE_S * 16000)
        assert inside == (len(turn) == 2), turn
