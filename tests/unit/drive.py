"""How the tests drive the bundled model: through the batch runner, the one loop that decodes it, or through the
pieces it is made of (a `SlotCache`, `prefill`, `batched_pass`, `keep`) when a test looks at one pass's logits."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from model.bundled.backend import BlockDiffusionBackend
from model.bundled.block_diffusion import BlockDiffusionLM
from model.chat.engine import DiffusionChatModel
from model.decoding.block_passes import BlockPasses
from model.decoding.options import PLAIN, GenerationOptions
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig
from model.decoding.speculative import SpeculativeDecoding
from model.decoding.step import DecodingSequence
from model.runtime.batch_runner import BatchRunner
from model.runtime.batching import Feed, SlotCache, additive_mask, batched_pass, keep, pass_layout, prefill
from scripts.report_lib.tiny_models import LLAMA_EOS


def sequence(
    chat: DiffusionChatModel, prompt: list[int], length: int, config: SamplerConfig | None = None,
    options: GenerationOptions = PLAIN,
) -> DecodingSequence:
    """The step object `chat`'s bundled back end makes for one answer of `length` tokens after `prompt`, with decoding
    settings `config` (the model's own by default) and the caller's `options` (temperature, seed, rules)."""
    if not isinstance(chat.backend, BlockDiffusionBackend):
        raise TypeError("only the bundled back end decodes through step objects")
    plan = chat.plan(prompt, dataclasses.replace(options, max_new_tokens=length), config)
    return chat.backend.sequence(plan)


def decode(runner: BatchRunner, sequence: DecodingSequence) -> list[Refinement]:
    """Every Refinement of `sequence` as `runner` decodes it (its cache kept for the next answer)."""
    return list(runner.submit(sequence))


def decode_alone(model: BlockDiffusionLM, sequence: DecodingSequence) -> list[Refinement]:
    """`decode` on a runner of its own, one answer a pass, closed afterwards."""
    runner = BatchRunner(model, max_batch=1)
    try:
        return decode(runner, sequence)
    finally:
        runner.close()


def speculative(
    model: BlockDiffusionLM, prompt: list[int], length: int, masks: int, eos: int = LLAMA_EOS, **options: object
) -> SpeculativeDecoding:
    """One answer's self-speculative decoding (autoregressive with `masks` 0) on `model`."""
    return SpeculativeDecoding(prompt, length, masks, model.mask_id, frozenset({eos}), **options)  # type: ignore[arg-type]


@torch.no_grad()
def reference_logits(model: BlockDiffusionLM, clean: Sequence[int], noisy: Sequence[int] = ()) -> torch.Tensor:
    """Logits `[len(clean) + len(noisy), V]` of one forward through the modules without a cache: `clean` causal with
    the gate off, `noisy` one block after it with the gate on. The exact reference that cached and fused passes are
    tested against."""
    layout = pass_layout([0], [Feed(tuple(clean), tuple(noisy))])
    ids, positions, noisy_rows, allowed = (t.to(model.base.device) for t in layout)
    return model(ids, positions, additive_mask(allowed), noisy_rows, None)[0]


def one_pass(model: BlockDiffusionLM, context: list[int], feed: Feed) -> tuple[torch.Tensor, torch.Tensor]:
    """(clean, noisy) logits of one pass over `feed` after `context` encoded in a fresh one-slot cache."""
    cache = SlotCache(1)
    prefill(model, cache, 0, context)
    [logits] = batched_pass(model, cache, [0], [feed])
    return logits


class BlockAnswer:
    """One diffusion answer's passes on a one-slot cache, as the batch runner runs a `DiffusionSequence`: the prompt
    prefilled (reusing what `cache` shares with it), then `block_logits` per pass and `finish_block` per block."""

    def __init__(
        self, model: BlockDiffusionLM, prompt: Sequence[int], cache: SlotCache | None = None, reuse: bool = True
    ) -> None:
        self.model = model
        self.cache = cache if cache is not None else SlotCache(1)
        self.passes = BlockPasses(prompt, model.vocab_size)
        self.reused_tokens, _ = prefill(model, self.cache, 0, self.passes.cached_prompt, reuse)

    def block_logits(self, canvas: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """Logits `[hi - lo, V + 1]` of the block's positions, from one cached pass."""
        feed = self.passes.feed(canvas, lo, hi)
        [(clean, noisy)] = batched_pass(self.model, self.cache, [0], [feed])
        logits, kept = self.passes.block_logits(clean, noisy)
        keep(self.cache, 0, feed, kept)
        return logits

    def finish_block(self, canvas: torch.Tensor, lo: int, hi: int) -> None:
        self.passes.finish_block(canvas, lo, hi)


def uncached_block_logits(
    model: BlockDiffusionLM, prompt: Sequence[int], canvas: torch.Tensor, lo: int, hi: int
) -> torch.Tensor:
    """The exact reference for `BlockAnswer.block_logits`: one cache-free forward through the modules over the prompt,
    the answer before the block and the block."""
    clean = [*prompt, *canvas[:lo].tolist()]
    logits = reference_logits(model, clean, canvas[lo:hi].tolist())
    passes = BlockPasses(clean, model.vocab_size, cached=False)
    return passes.block_logits(logits[: len(clean)], logits[len(clean) :])[0]
