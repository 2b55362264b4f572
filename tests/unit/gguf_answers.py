"""Answers of a user's GGUF model through the chat engine and the back end's batch runner, for the tests of both
runtimes (tests/unit/test_gguf_model.py: de-quantized modules; test_gguf_fast.py: the file's own blocks)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.chat.spec import ModelSpec
from model.cli import main
from model.errors import ModelError
from scripts.report_lib.tiny_gguf import Shape, write_model

# Prompts of different lengths, so that answers batched together sit at different positions
TEXTS = ("hello the world", "the he", "what is this", "a b c d e f g")


def answer(chat: DiffusionChatModel, text: str, length: int) -> tuple[list[int], list[int]]:
    """(prompt, answer tokens, with the end token that stopped it) through the chat engine and the back end's batch
    runner."""
    prompt = chat.prompt_ids([ChatMessage("user", text)])
    last = list(chat.stream_prompt(prompt, GenerationOptions(max_new_tokens=length)))[-1]
    assert last.refinement is not None and last.done
    tokens = list(last.refinement.tokens[: last.completion_tokens])
    if last.finish_reason == "stop":
        tokens.append(last.refinement.tokens[last.completion_tokens])
        assert tokens[-1] in chat.backend.eos_ids  # type: ignore[attr-defined]
    return prompt, tokens


def assert_refused_by_a_model_of_another_shape(adapter: Path, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An adapter folder (a LoRA, a drafter) given to a wider model than its own is refused in one line, before
    anything loads, and by the CLI with exit 2."""
    other = write_model(folder / "wider.gguf", "llama", GGMLQuantizationType.Q8_0,
                        shape=Shape(hidden=96, intermediate=160)).path
    with pytest.raises(ModelError, match=r"does not fit wider\.gguf"):
        ModelSpec(source=str(other), adapter=str(adapter))
    assert main(["generate", "hello", "--model", str(other), "--adapter", str(adapter)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("dlm: the adapter in") and error.count("\n") == 1


def answers_per_pass(chat: DiffusionChatModel, text: str, length: int) -> tuple[list[int], float]:
    """(answer tokens, tokens committed per pass)."""
    prompt = chat.prompt_ids([ChatMessage("user", text)])
    last = list(chat.stream_prompt(prompt, GenerationOptions(max_new_tokens=length)))[-1]
    assert last.refinement is not None
    return list(last.refinement.tokens[: last.completion_tokens]), last.completion_tokens / (last.step + 1)


def assert_batched_answers_equal_lone_answers(
    chat: DiffusionChatModel, length: int = 10, texts: tuple[str, ...] = TEXTS
) -> None:
    """Each of `texts` answered alone, then all at once from threads (their passes batched together): every answer
    is the one it got alone."""
    alone = [answer(chat, text, length)[1] for text in texts]
    together: list[list[int] | None] = [None] * len(texts)

    def run(index: int) -> None:
        together[index] = answer(chat, texts[index], length)[1]

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert together == alone
