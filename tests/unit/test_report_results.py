"""scripts/report_lib/results.py: the one way the benchmarks print their summary and save their whole result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.report_lib.results import print_and_save


def test_the_summary_goes_to_stdout_and_the_whole_result_to_the_file(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    result = {"turns": 2, "per_turn": [{"ms": 410}, {"ms": 520}]}
    path = tmp_path / "new" / "folder" / "run.json"
    print_and_save({"turns": 2}, result, path, indent=1)
    assert json.loads(capsys.readouterr().out) == {"turns": 2}
    assert json.loads(path.read_text()) == result and path.read_text().endswith("}\n")


def test_without_a_path_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    print_and_save({"a": 1}, {"a": 1, "b": 2}, None)
    assert json.loads(capsys.readouterr().out) == {"a": 1} and list(tmp_path.iterdir()) == []
