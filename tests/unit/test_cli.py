"""`dlm generate` on a tiny real checkpoint: live passes, final figures, errors as exit code 2."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from model.chat import Draft, DraftPiece
from model.cli import DIM_UNDERLINE, LiveView, main, render_ansi, render_plain
from scripts.report_lib.tiny_models import tiny_bert


def test_generate_prints_every_pass_and_the_speed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tiny_bert(tmp_path / "bert")
    lengths = ["--max-new-tokens", "8", "--block-length", "4", "--steps", "2"]
    code = main(["generate", "hello there", "--model", str(folder), *lengths, "--no-cache"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    passes = [line for line in out if line.startswith("pass")]
    assert len(passes) == 4  # two blocks of 4 tokens at two passes each
    assert "_" in passes[0]  # a half-committed block shows its guesses as underscores
    assert "tokens/s" in out[-1] and "2.00 tokens/pass" in out[-1]


def test_unknown_model_exits_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--model", str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().err


def test_rendering_marks_guesses() -> None:
    draft = Draft(step=0, pieces=(DraftPiece("Hi", True), DraftPiece(" you", False)))
    assert render_plain(draft) == "Hi ___"
    assert render_ansi(draft) == f"Hi{DIM_UNDERLINE} you\033[0m"


def test_live_view_redraws_in_place_on_a_terminal() -> None:
    out = io.StringIO()
    view = LiveView(out, tty=True)
    view.show(Draft(step=0, pieces=(DraftPiece("one\ntwo\nthree", False),)))
    view.show(Draft(step=1, pieces=(DraftPiece("one\ntwo\nthree", True),)))
    assert "\033[2F\r\033[J" in out.getvalue()  # back up over the three lines drawn before


def test_generate_says_which_device_ran_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tiny_bert(tmp_path / "bert")
    lengths = ["--max-new-tokens", "4", "--block-length", "4", "--steps", "2"]
    assert main(["generate", "hi", "--model", str(folder), *lengths, "--device", "cpu"]) == 0
    assert " on cpu (" in capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there: --device cuda would use it")
def test_device_cuda_without_a_gpu_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "hi", "--model", str(tmp_path / "missing"), "--device", "cuda"]) == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err
