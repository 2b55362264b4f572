"""The passes of one answer as the chat model runs them, for the tests and benchmarks that read each pass's tokens:
they measure the loop that runs (the back end's), not a copy of it."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Sequence

from model.bundled.backend import BlockDiffusionBackend
from model.chat.engine import DiffusionChatModel
from model.decoding.options import PLAIN, GenerationOptions
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig
from model.process import watch


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


class PassLog:
    """The batch runner's passes as they run: the slots of every pass, in order (`with PassLog() as log:`). It
    watches the runner's own span of each pass's forward (model/process/watch.py), so it sees the passes the runner
    really makes, of every runner alive, each before the answers in it hear of it."""

    def __init__(self) -> None:
        self.slots: list[tuple[int, ...]] = []  # the slots each pass carried (one answer a slot)
        self._lock = threading.Lock()
        self._watching = contextlib.ExitStack()

    @property
    def sizes(self) -> list[int]:
        """Answers in each pass."""
        return [len(slots) for slots in self.slots]

    def first_pass_of(self, slot: int) -> int | None:
        """The index of the first pass that carried `slot` (None: none did)."""
        return next((index for index, slots in enumerate(self.slots) if slot in slots), None)

    def _seen(self, span: watch.Span) -> None:
        if span.kind == watch.LM_FORWARD:
            with self._lock:
                self.slots.append(span.detail)

    def __enter__(self) -> PassLog:
        self._watching.enter_context(watch.watching(self._seen))
        return self

    def __exit__(self, *exc: object) -> None:
        self._watching.close()
