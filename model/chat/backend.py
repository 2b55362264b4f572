"""The one contract between the chat engine and whatever computes the passes: a back end returns the refinements of
one answer the engine planned.

The engine (model/chat/engine.py) is the text layer: it formats the chat, checks the context, builds the answer's
guard and end-of-turn probe from the tokenizer's vocabulary, and turns each pass into a `Draft`. A back end owns the
network and how answers share it:

- the bundled block-diffusion model (`model.bundled.backend.BlockDiffusionBackend`): every answer a step object its
  batch runner drives, many answers a pass;
- an external checkpoint's `Denoiser` (`model.adapters.sampler_backend`): the sampler's `generate`, one answer at a
  time (`OneAtATime`);
- DiffusionGemma (`model.adapters.diffusion_gemma`): its own generate, one answer at a time (`OneAtATime`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from model.decoding.grammar import Grammar
from model.decoding.options import GenerationOptions
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig
from model.decoding.speech_guard import SpeechGuard
from model.errors import GenerationCancelled
from model.fair_lock import FairLock


@dataclass(frozen=True, slots=True)
class EndOfTurnRow:
    """Where an answer's first pass reads the LM's end-of-turn probability (model/decoding/end_of_turn.py): the
    prompt's row of the user's last word, and the tokens that end a message there."""

    row: int
    end_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AnswerPlan:
    """One answer as the text layer prepared it: what a back end needs to compute its passes."""

    prompt: list[int]
    length: int  # answer positions: `options.max_new_tokens` rounded up to whole blocks of `config`
    config: SamplerConfig  # the model's decoding settings
    options: GenerationOptions  # the caller's: temperature, seed, priority, conversation
    guard: SpeechGuard | None  # the caller's `AnswerRules` for this prompt (None: every rule off)
    probe: EndOfTurnRow | None  # None: the prompt does not end with a user message of the chat template
    # The caller's `response_format` as this answer's parser state (None: free text); the step object advances it
    grammar: Grammar | None = None


class AnswerPasses(Protocol):
    """The passes of one answer: iterate for its Refinements (the last has done=True); `close` frees the model at
    once (a lock, a batch slot) when the caller stops early."""

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens the back end found already encoded (read after the first pass)."""
        ...

    def __iter__(self) -> Iterator[Refinement]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """What computes the passes of a local model's answers."""

    @property
    def max_batch(self) -> int:
        """How many answers it decodes at once (1: one at a time, callers queue)."""
        ...

    @property
    def constrains(self) -> bool:
        """Whether its passes follow the plan's `grammar` (a response format, tool calls) in every decoding mode."""
        ...

    def check(self, config: SamplerConfig) -> None:
        """Refuse (`ModelError`) decoding settings this back end cannot run, when the model is built."""
        ...

    def answer(self, plan: AnswerPlan, cancel: threading.Event | None) -> AnswerPasses:
        """Start the answer; setting `cancel` ends it within one pass (its last Refinement says "cancelled")."""
        ...

    def prepare(self, tokens: list[int], cancel: threading.Event | None, conversation: str | None) -> bool:
        """Encode `tokens` (the known start of a conversation's next prompt) while the model is idle; False when this
        back end keeps no cache between answers."""
        ...

    def standing_aside(self, seconds: float) -> AbstractContextManager[None]:
        """While held (at most `seconds`), start no pass: other work of the process has someone waiting on it."""
        ...


class _Passes:
    """An answer's passes as a generator, with nothing encoded ahead."""

    reused_tokens = 0

    def __init__(self, passes: Generator[Refinement, None, None]) -> None:
        self._passes = passes

    def __iter__(self) -> Iterator[Refinement]:
        return self._passes

    def close(self) -> None:
        self._passes.close()


class OneAtATime:
    """A back end that computes one answer at a time, first come first served (`FairLock`): `passes` is the network's
    own loop over one answer. A caller that gives up while it waits leaves the queue, having computed nothing."""

    max_batch = 1

    def __init__(self, passes: Callable[[AnswerPlan, threading.Event | None], Iterator[Refinement]],
                 check: Callable[[SamplerConfig], None], constrains: bool) -> None:
        self._passes = passes
        self._check = check
        self.constrains = constrains
        self._lock = FairLock()

    def check(self, config: SamplerConfig) -> None:
        self._check(config)

    def answer(self, plan: AnswerPlan, cancel: threading.Event | None) -> AnswerPasses:
        return _Passes(self._locked(plan, cancel))

    def prepare(self, tokens: list[int], cancel: threading.Event | None, conversation: str | None) -> bool:
        return False

    def standing_aside(self, seconds: float) -> AbstractContextManager[None]:
        return contextlib.nullcontext()  # an answer's passes run in its caller's thread: nothing to hold

    def _locked(self, plan: AnswerPlan, cancel: threading.Event | None) -> Generator[Refinement, None, None]:
        if not self._lock.acquire(cancel):  # cancelled while other answers held the model: nothing was computed
            raise GenerationCancelled("cancelled while waiting for the model")
        try:
            yield from self._passes(plan, cancel)
        finally:
            self._lock.release()
