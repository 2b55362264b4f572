"""The one interface the sampler needs from a masked-diffusion checkpoint.

Every adapter of an external checkpoint (masked LMs such as ModernBERT, LLaDA-style remote-code models) turns it into a
`Denoiser`, which the sampler's `generate` drives one answer at a time. The sampler owns the answer canvas and the
commit policy; the denoiser owns the network, its attention pattern and its KV/prefix cache. The bundled
block-diffusion model is no `Denoiser`: its answers are step objects that its batch runner drives
(model/runtime/batch_runner.py).

Call order for one answer::

    denoiser.start(prompt_ids, max_new_tokens, use_cache)     # encode the prompt once
    for each block [lo, hi) of the answer region:
        repeat: logits = denoiser.block_logits(canvas, lo, hi)  # one pass, [hi - lo, vocab]
        denoiser.finish_block(canvas, lo, hi)                   # block is final: extend the cache

`canvas` is the whole answer region (length `max_new_tokens`), holding committed tokens and `mask_id` elsewhere.
Positions are relative to the start of the answer.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Denoiser(Protocol):
    """A network that predicts every masked position of the active block at once."""

    mask_id: int  # id the sampler writes into positions that are still masked
    eos_ids: frozenset[int]  # ids that end the answer
    vocab_size: int  # width of the logits returned by `block_logits`
    block_causal: bool  # True: finished blocks never see later ones, so their cache is exact

    def start(self, prompt_ids: list[int], max_new_tokens: int, use_cache: bool) -> None:
        """Reset per-answer state and, with `use_cache`, encode the prompt into the prefix cache."""
        ...

    def block_logits(self, canvas: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """One denoising pass: float32 logits `[hi - lo, vocab_size]` for the answer positions `lo..hi-1`.

        `canvas` is `[max_new_tokens]` (long). The logits must never favour `mask_id` (adapters set it to -inf).
        """
        ...

    def finish_block(self, canvas: torch.Tensor, lo: int, hi: int) -> None:
        """The block `lo..hi-1` is final: fold it into the cache (exact if block-causal, refreshed otherwise)."""
        ...


# What some denoisers offer beyond `Denoiser`: the engine asks with isinstance, so each capability is named here.
@runtime_checkable
class Forkable(Protocol):
    """A denoiser that makes a second state over the same weights (classifier-free guidance's unconditional pass)."""

    def fork(self) -> Denoiser: ...


