"""The step protocol: how a decoding policy and the loop that runs it talk, one pass at a time.

Each policy is a step object per answer (`SpeculativeDecoding` in model/decoding/speculative.py: self-speculative and
autoregressive; `DiffusionSequence` in model/decoding/block_passes.py: the threshold sampler on the bundled model's
cache). The loop (`BatchRunner`, model/runtime/batch_runner.py) is the same for all of them::

    encode the answer's `cached_prompt` into its cache slot
    repeat:
        feed = answer.feed(crowd)                        # the rows of its next pass: clean tokens, then noisy ones
        clean, noisy = one forward over every answer's feed
        refinement, kept = answer.consume(clean, noisy, elapsed_s, cancelled)
        the cache keeps the first `kept` clean rows; the rest is overwritten by the next pass
    until refinement.done

A policy knows nothing of caches, batches or threads, and the loop nothing of drafts, blocks or commit rules. What
else a sequence may ask of the loop it declares as a capability: `FoldsPrompt` (its first pass can encode the
prompt's uncached tail) and `ReadsPromptRow` (it reads the prediction after one prompt token, computed afresh).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from model.decoding.refinement import Refinement


@dataclass(frozen=True, slots=True)
class Feed:
    """The rows one sequence feeds to a pass: `clean` tokens, then `noisy` ones (mask ids or a block's canvas).

    `after` (one entry per noisy row, or empty) splits the noisy rows into blocks: a row with value g belongs to the
    block that follows the first g clean tokens, sits at the positions right after clean token g - 1, sees only those
    g clean tokens (and the cache) and the rows of its own block. Empty: one block after every clean token. Self-
    speculative decoding drafts one block after each draft it verifies, so whichever draft is rejected, the block that
    followed the accepted ones holds the next pass's drafts.
    """

    clean: tuple[int, ...]
    noisy: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    # The noisy rows only propose drafts that the next pass's clean rows verify (self-speculative mask rows): the
    # answer never depends on their logits, so the pass may compute them coarser (model/runtime/kernels/).
    drafts: bool = False
    # False: the rows only write their keys and values (a prompt's part encoded beside other answers' passes:
    # model/runtime/batch_runner.py), and the pass computes no logits for them
    logits: bool = True
    # The target's residual rows after these layers, for the clean rows: what a drafter reads (model/drafting/); the
    # pass hands them to the sequence (`ReadsTaps`)
    taps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        after = self.after
        if after and (
            len(after) != len(self.noisy)
            or not all(1 <= g <= len(self.clean) for g in after)
            or list(after) != sorted(after)
        ):
            raise ValueError("Feed.after needs one value in [1, len(clean)] per noisy row, in ascending order")

    @property
    def rows(self) -> int:
        return len(self.clean) + len(self.noisy)


class DecodingSequence(Protocol):
    """One answer's decoding as a step object (see the module docstring). Not `collections.abc.Sequence`: a sequence
    here is an answer being decoded."""

    @property
    def cached_prompt(self) -> list[int]:
        """What the cache must hold before the first pass."""
        ...

    def feed(self, crowd: int = 1) -> Feed:
        """The rows of this answer's next pass; `crowd`: how many answers share the pass."""
        ...

    def consume(
        self, clean_logits: torch.Tensor, noisy_logits: torch.Tensor, elapsed_s: float, cancelled: bool = False
    ) -> tuple[Refinement, int]:
        """The pass's logits for this answer's rows (clean `[len(clean), V]`, noisy `[len(noisy), V]`), the pass's
        time, and whether the caller cancelled -> (the pass's Refinement, how many clean rows the cache keeps)."""
        ...


class Drafts(Protocol):
    """An answer's drafter (model/drafting/context.py): it reads the target's tapped rows of the tokens the answer
    keeps and drafts the block after them."""

    @property
    def taps(self) -> tuple[int, ...]: ...

    @property
    def block(self) -> int: ...

    def extend(self, tapped: torch.Tensor) -> None: ...

    def draft(self, last: int) -> tuple[list[int], list[float]]: ...


@runtime_checkable
class ReadsTaps(Protocol):
    """A sequence whose feeds ask for tapped rows (`Feed.taps`): the runner hands it the clean rows' ones
    `[len(clean), taps, hidden]` right before `consume`."""

    def take_taps(self, tapped: torch.Tensor) -> None: ...


@runtime_checkable
class TimesItsPasses(Protocol):
    """A sequence that times its lone passes to learn what each layout costs (the draft policy's, speculative.py).
    `untimed()` after `feed`: this pass runs on another team of threads than usual (the runner's lead passes), so its
    time says nothing about the usual costs."""

    def untimed(self) -> None: ...


@runtime_checkable
class FoldsPrompt(Protocol):
    """A sequence whose first pass can also encode the prompt's uncached tokens before its last one (as many as the
    runner's `FOLD_LIMIT`) instead of a prefill of their own. Every decoding policy's sequence can."""

    def fold_prompt(self, tokens: Sequence[int]) -> None: ...


class FoldingSequence(DecodingSequence, FoldsPrompt, Protocol):
    """A decoding sequence that folds (every decoding policy's): what a wrapper around one, such as the end-of-turn
    probe, may forward to."""


@runtime_checkable
class ReadsPromptRow(Protocol):
    """A sequence that reads the model's prediction right after prompt token `row` (the end-of-turn probe,
    model/decoding/end_of_turn.py: after the user's last word), so the loop computes that token afresh even when an
    earlier prompt left it in the cache. A prompt folded into the first pass (`FoldsPrompt`) starts at `row` at the
    latest, so the row's logits are among the pass's clean ones, which `consume` reads. Otherwise an interactive
    answer's prefill stops right after `row` and hands its prediction to `prefilled`; a bulk answer's does not
    (nobody waits on its end of turn)."""

    row: int

    def prefilled(self, logits: torch.Tensor) -> None:
        """The prefill up to and including prompt token `row` predicted `logits` `[V]` for the token after it."""
        ...
