"""The independent latency client's core (scripts/heard_latency.py): where a recording's speech really ends, the
resampling it streams, the held-out choice, the summary; and that it imports nothing of the session."""

from __future__ import annotations

import ast
import wave
from pathlib import Path

import numpy as np
import pytest

from scripts import heard_latency as hl

RATE = 8000


def tone(seconds: float, rate: int = RATE, level: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (level * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def test_speech_ends_where_the_sound_does_not_where_the_file_does() -> None:
    rng = np.random.default_rng(0)
    noise = lambda n: (rng.standard_normal(n) * 1e-3).astype(np.float32)  # noqa: E731  (-54 dB of the tone)
    samples = np.concatenate([noise(800), tone(1.0), noise(4000)])
    end = hl.speech_end(samples, RATE)
    assert abs(end - (800 + RATE)) <= RATE // 100  # within one 10 ms frame of the tone's last sample


def test_a_soft_last_syllable_is_still_speech_but_a_far_quieter_tail_is_not() -> None:
    soft = tone(0.2, level=0.5 * 10 ** (-30 / 20))  # 30 dB down: speech
    faint = tone(0.2, level=0.5 * 10 ** (-45 / 20))  # 45 dB down: room tone
    samples = np.concatenate([tone(0.5), soft, faint])
    assert abs(hl.speech_end(samples, RATE) - int(0.7 * RATE)) <= RATE // 100


def test_silence_has_no_speech_end() -> None:
    assert hl.speech_end(np.zeros(RATE, dtype=np.float32), RATE) == 0
    assert hl.speech_end(np.zeros(3, dtype=np.float32), RATE) == 0


def test_resampling_keeps_the_duration_and_the_waveform() -> None:
    samples = tone(0.5)
    up = hl.to_rate(samples, RATE, 16000)
    assert len(up) == 2 * len(samples)
    assert np.allclose(up[::2], samples, atol=1e-6)  # every other sample is an original one
    assert hl.to_rate(up, 16000, 16000) is not up and np.array_equal(hl.to_rate(up, 16000, 16000), up)


def write_wav(path: Path, samples: np.ndarray, rate: int = RATE) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return path


def test_the_held_out_choice_is_fixed_by_its_seed_and_keeps_short_prompts(tmp_path: Path) -> None:
    for i, seconds in enumerate([0.3, 0.8, 1.5, 2.0, 3.5, 5.0]):
        write_wav(tmp_path / f"p{i}.wav", tone(seconds))
    chosen = hl.held_out(6, seed=1, folder=tmp_path)
    assert {p.name for p in chosen} == {"p1.wav", "p2.wav", "p3.wav", "p4.wav"}  # 0.6-4 s only, cycled to 6
    assert len(chosen) == 6 and chosen == hl.held_out(6, seed=1, folder=tmp_path)
    assert hl.held_out(3, folder=tmp_path / "absent") == []
    samples, rate = hl.read_wav(chosen[0])
    assert rate == RATE and samples.dtype == np.float32


def test_the_summary_reads_percentiles_holds_and_speculation() -> None:
    turns = [hl.Turn(f"t{i}", 1.0, heard_ms=float(ms), server_ms=float(ms) - 20, stats={"hits": 1, "misses": 0})
             for i, ms in enumerate([300, 400, 500, 1200])]
    turns.append(hl.Turn("silent", 1.0, errors=["no turn_end"]))
    result = hl.summary(turns)
    assert result["answered"] == 4 and result["turns"] == 5
    assert result["heard_ms"]["p50"] == pytest.approx(450.0) and result["heard_ms"]["max"] == 1200.0
    assert result["held_past_1s"] == 1
    assert result["speculative_tts"]["hits_per_turn"] == pytest.approx(4 / 5)


def test_the_client_shares_no_code_with_the_session() -> None:
    """Its figure is only independent while it imports nothing of voice/, web/ or model/ (nor the other scripts,
    whose helpers do)."""
    tree = ast.parse(Path(hl.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & {"voice", "web", "model", "scripts"}


def test_an_unreadable_recording_or_no_server_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav")
    assert hl.main([str(bad), "--url", "ws://127.0.0.1:9/ws", "--turns", "1"]) == 2
    assert "cannot read" in capsys.readouterr().err
    good = write_wav(tmp_path / "good.wav", tone(1.0))
    assert hl.main([str(good), "--url", f"ws://127.0.0.1:{hl.free_port()}/ws", "--turns", "1"]) == 2
    assert "cannot reach" in capsys.readouterr().err
