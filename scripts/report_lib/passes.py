"""The passes of one answer as the chat model runs them, for the tests and benchmarks that read each pass's tokens:
they measure the loop that runs (the back end's), not a copy of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from model.bundled.backend import BlockDiffusionBackend
from model.chat.engine import DiffusionChatModel
from model.decoding.options import PLAIN, GenerationOptions
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig


def answer_refinements(
    chat: DiffusionChatModel, prompt: Sequence[int], length: int, config: SamplerConfig | None = None,
    options: GenerationOptions = PLAIN,
) -> Iterator[Refinement]:
    """Every pass of one answer of `length` tokens after `prompt`, through `chat`'s back end (its batch runner for the
    bundled model), with decoding settings `config` (the model's own by default) and the caller's `options`."""
    plan = chat.plan(list(prompt), dataclasses.replace(options, max_new_tokens=length), config)
    passes = chat.backend.answer(plan, None)
    try:
        yield from passes
    finally:
        passes.close()


def stop_batching(chat: DiffusionChatModel) -> None:
    """End the bundled model's batch runner thread, for a benchmark that times passes on its own thread: the runner's
    thread keeps an OpenMP team (it ran the draft calibration at load), and two teams on two cores slow every pass
    2-3x (model/runtime/passing_thread.py). Other back ends keep no thread."""
    if isinstance(chat.backend, BlockDiffusionBackend):
        chat.backend.runner.close()
