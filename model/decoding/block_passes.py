"""Threshold diffusion on the bundled block-diffusion model: the sampler's steps (`DiffusionDecoding`) on the model's
KV cache, as one step object (`DiffusionSequence`, model/decoding/step.py) the batch runner drives.

`BlockPasses` is the cache side: which tokens each pass feeds and how a pass's logits become the active block's.
Finished blocks are exact in the cache (a block never sees later ones), so a block is encoded once, fused into the
first pass of the next one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from model.decoding.refinement import Refinement
from model.decoding.sampler import DiffusionDecoding
from model.decoding.step import Feed
from model.errors import ModelError


class BlockPasses:
    """The cache side of diffusion decoding on a block-diffusion model, for one answer: which tokens a pass over block
    `[lo, hi)` feeds, and how its logits become the block's.

    A pass feeds the clean tokens not yet cached (the prompt's last token before the first block; the block finished
    just before, fused into the next block's first pass) followed by the noisy block. Logits for the block's first
    position come from the last clean position (the teacher's own next-token prediction); logits for position
    `lo + j` (j >= 1) from noisy position `lo + j - 1`. Blocks run in order: a block's pass needs the cache to end
    where it starts.

    Not `cached` (`--no-cache`, for comparisons): nothing is cached, so every pass feeds the whole prompt and every
    finished block again, and keeps none of it.
    """

    def __init__(self, prompt: Sequence[int], vocab_size: int, cached: bool = True) -> None:
        if not prompt:
            raise ModelError("the prompt is empty: nothing to condition the answer on")
        self.prompt = tuple(prompt)
        self.vocab_size = vocab_size  # the network's; the mask id's column is added, always -inf
        self.cached = cached
        self.pending: tuple[int, ...] = self.prompt[-1:]  # clean tokens not yet in the cache
        self.next_logits: torch.Tensor | None = None  # [V] prediction for the first uncached position
        self.lo = 0  # where the next block starts: every block before it is finished

    @property
    def cached_prompt(self) -> list[int]:
        """What the cache must hold before the first pass."""
        return list(self.prompt[:-1]) if self.cached else []

    def feed(self, canvas: torch.Tensor, lo: int, hi: int) -> Feed:
        if lo != self.lo:
            raise ModelError("blocks must be denoised in order: the cache does not end where this block starts")
        clean = self.pending if self.cached else (*self.prompt, *canvas[:lo].tolist())
        return Feed(clean=clean, noisy=tuple(canvas[lo:hi].tolist()))

    def block_logits(self, clean_logits: torch.Tensor, noisy_logits: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(logits `[hi - lo, V + 1]` of the block, clean tokens the cache keeps: all of them, or none uncached)."""
        kept = len(self.pending) if self.cached else 0
        if clean_logits.shape[0]:
            self.next_logits, self.pending = clean_logits[-1], ()
        if self.next_logits is None:
            raise ModelError("the first pass of an answer must feed the prompt's last token")
        length = noisy_logits.shape[0]
        out = torch.cat([self.next_logits.unsqueeze(0), noisy_logits[: length - 1]]).float()[:, : self.vocab_size]
        return torch.cat([out, torch.full((length, 1), -torch.inf, device=out.device)], dim=1), kept

    def finish_block(self, canvas: torch.Tensor, lo: int, hi: int) -> None:
        # Encoded lazily: fused into the next block's first pass, so a finished answer costs no extra forward.
        self.lo = hi
        if self.cached:
            self.pending = tuple(canvas[lo:hi].tolist())


class DiffusionSequence:
    """The threshold sampler's decoding (`DiffusionDecoding`) on a block-diffusion model's cache (`BlockPasses`)."""

    def __init__(self, decoding: DiffusionDecoding, passes: BlockPasses) -> None:
        self.decoding = decoding
        self.passes = passes

    @property
    def cached_prompt(self) -> list[int]:
        return self.passes.cached_prompt

    def fold_prompt(self, tokens: Sequence[int]) -> None:
        """Encode `tokens` in the first pass, before the prompt's last token (see `SpeculativeDecoding`)."""
        self.passes.pending = (*tokens, *self.passes.pending)

    def feed(self, crowd: int = 1) -> Feed:
        return self.passes.feed(self.decoding.canvas, self.decoding.lo, self.decoding.hi)

    def consume(
        self, clean_logits: torch.Tensor, noisy_logits: torch.Tensor, elapsed_s: float, cancelled: bool = False
    ) -> tuple[Refinement, int]:
        logits, kept = self.passes.block_logits(clean_logits, noisy_logits)
        refinement = self.decoding.consume(logits.cpu().clone(), elapsed_s, cancelled)
        if self.decoding.finished_block is not None:
            self.passes.finish_block(self.decoding.canvas, *self.decoding.finished_block)
        return refinement, kept
