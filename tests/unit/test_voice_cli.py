"""The voice-assistant command line as the README writes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from web.cli import build_parser, engine_config


def test_file_mode_takes_its_options_after_the_inputs() -> None:
    """`--out` must reach the `file` command: with abbreviations on, Python 3.11's top-level parser took it for an
    ambiguous prefix of --output-device / --output-latency and refused the README's own command."""
    args = build_parser().parse_args(["file", "a.wav", "b.wav", "--out", "out.wav", "--json", "t.json", "--realtime"])
    assert args.command == "file" and args.inputs == [Path("a.wav"), Path("b.wav")]
    assert args.out == Path("out.wav") and args.json == Path("t.json") and args.realtime


def test_device_reaches_the_engine_config() -> None:
    assert engine_config(build_parser().parse_args(["serve"])).device == "auto"
    assert engine_config(build_parser().parse_args(["--device", "cpu", "serve"])).device == "cpu"
    file_args = build_parser().parse_args(["file", "a.wav", "--out", "o.wav", "--device", "cuda"])
    assert engine_config(file_args).device == "cuda"


def test_max_batch_is_checked_before_any_model_loads() -> None:
    assert engine_config(build_parser().parse_args(["serve", "--max-batch", "2"])).lm.max_batch == 2
    with pytest.raises(SystemExit, match="--max-batch must be at least 1"):
        engine_config(build_parser().parse_args(["file", "a.wav", "--out", "o.wav", "--max-batch", "0"]))
    assert engine_config(build_parser().parse_args(["--lm-threads", "2", "serve"])).lm_threads == 2
    with pytest.raises(SystemExit, match="--lm-threads must be 0"):
        engine_config(build_parser().parse_args(["serve", "--lm-threads", "-1"]))


@pytest.mark.parametrize("command", [["serve"], ["file", "a.wav", "--out", "o.wav"]])
def test_options_before_the_command_are_kept(command: list[str]) -> None:
    """A command's copy of the common options used to set its own defaults over those given before the command."""
    parse = build_parser().parse_args
    before = parse(["--max-batch", "2", "--no-speculation", "--max-new-tokens", "40", *command])
    assert (before.max_batch, before.no_speculation, before.max_new_tokens) == (2, True, 40)
    after = parse([*command, "--max-batch", "3", "--no-speculation"])
    assert (after.max_batch, after.no_speculation, after.max_new_tokens) == (3, True, 64)
    neither = parse(command)
    assert (neither.max_batch, neither.no_speculation, neither.max_new_tokens) == (None, False, 64)
    assert neither.verbose is False
