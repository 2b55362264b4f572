"""The training objective of the block-diffusion adapter, as pure tensor code (the script only loops and saves).

One step on a batch of (prompt, teacher answer) pairs:

1. Clean pass, no gradient, adapter off: encode prompt + answer causally; its KV cache is exactly what inference
   will have for finished blocks.
2. Noisy pass, adapter on: `copies` independently masked versions of the answer region (each block masked with its
   own ratio t ~ U(0, 1)) attend to the clean cache strictly before their block and bidirectionally inside their block.
   Several noisy copies share one clean pass, which makes a CPU step cheaper per supervised token.
3. Loss: cross-entropy at masked positions, predicted with the next-token shift from the position before them in the
   same block (a block's first token is predicted by the clean stream: the teacher, which is not trained).

Positions after the answer's EOS inside its last block are filled with EOS and supervised, so the model learns the
sampler's convention that everything after a committed EOS is EOS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from model.bundled.block_diffusion import BlockDiffusionLM
from model.runtime.batching import additive_mask


@dataclass(frozen=True, slots=True)
class Batch:
    clean_ids: torch.Tensor  # [b, T]
    clean_bias: torch.Tensor  # [b, 1, T, T]
    noisy_ids: torch.Tensor  # [b, K*N]
    noisy_pos: torch.Tensor  # [b, K*N]
    noisy_bias: torch.Tensor  # [b, 1, K*N, T + K*N]
    targets: torch.Tensor  # [b, K*N]  token predicted from each noisy position, -100 where unsupervised
    weights: torch.Tensor  # [b, K*N]  loss weight of each supervised position


def make_batch(
    examples: Sequence[tuple[list[int], list[int]]],  # (prompt_ids, answer_ids ending with EOS)
    block: int,
    mask_id: int,
    eos_id: int,
    copies: int,
    generator: torch.Generator,
    drafting: bool = False,
    near_weight: float = 1.0,
) -> Batch:
    """A training batch. `drafting`: what self-speculative decoding asks of the masks, laid out as a decoding pass
    lays them out: each copy's blocks shifted by its own random offset (a draft starts after a clean prefix at any
    position), every block fully masked, and its last position hidden, so a block is `block - 1` mask rows that draft
    the `block - 1` tokens after the teacher's next one (model/decoding/speculative.py feeds exactly that many masks
    after a
    clean token). `near_weight` < 1 weights the j-th drafted token of a block near_weight ** (j - 1), nearer ones
    more (a draft is only accepted after every draft before it)."""
    b = len(examples)
    prompt_lens = [len(p) for p, _ in examples]
    # answer regions rounded up to whole blocks, EOS-filled
    answers = []
    for _, a in examples:
        length = -(-len(a) // block) * block
        answers.append(a + [eos_id] * (length - len(a)))
    n = max(len(a) for a in answers)
    t = max(p + len(a) for p, a in zip(prompt_lens, answers, strict=True))

    clean_ids = torch.full((b, t), eos_id)
    for row, ((p_ids, _), a) in enumerate(zip(examples, answers, strict=True)):
        clean_ids[row, : len(p_ids) + len(a)] = torch.tensor(p_ids + a)
    q = torch.arange(t)
    clean_bias = additive_mask(q[:, None] >= q[None, :])[None, None].expand(b, 1, t, t)

    j = torch.arange(n)  # answer position
    offset = torch.zeros(copies, dtype=torch.long)
    if drafting:
        offset = torch.randint(0, block, (copies,), generator=generator)
    shifted = j[None, :] + offset[:, None]  # [K, n]
    block_of, in_block = shifted // block, shifted % block  # [K, n] each copy's own block boundaries
    valid = torch.zeros((b, n), dtype=torch.bool)
    answer = torch.full((b, n), eos_id)
    for row, a in enumerate(answers):
        valid[row, : len(a)] = True
        answer[row, : len(a)] = torch.tensor(a)

    # --- mask each (copy, block) with its own ratio, or everything when drafting ---
    blocks = n // block + 2
    index = block_of[None].expand(b, copies, n)
    ratio = torch.rand((b, copies, blocks), generator=generator).gather(2, index)  # [b, K, n]
    masked = torch.rand((b, copies, n), generator=generator) < ratio
    # every block must supervise at least one position after its first
    # (a position in 1..block-1, never the first: that one is the teacher's and carries no loss)
    forced = torch.randint(1, block, (b, copies, blocks), generator=generator).gather(2, index)
    masked |= in_block[None] == forced
    if drafting:
        masked[:] = True
    masked &= valid[:, None, :]
    noisy_ids = torch.where(masked, torch.full_like(masked, mask_id, dtype=torch.long), answer[:, None, :])

    # targets: position j predicts j+1 inside the same block, where j+1 is masked
    nxt = (j + 1).clamp(max=n - 1)
    same_block = (j + 1 < n) & (block_of[:, nxt] == block_of)  # [K, n]
    target_tok = answer[:, nxt][:, None, :].expand(b, copies, n)
    supervised = same_block[None] & masked[:, :, nxt] & valid[:, None, nxt]
    targets = torch.where(supervised, target_tok, torch.full_like(target_tok, -100))
    start = (j - in_block).clamp(min=0)  # [K, n] answer position where each block starts (a shifted first one is short)
    weights = (near_weight ** (j - start).float())[None].expand(b, copies, n) * supervised  # j - start: draft index - 1

    prompt = torch.tensor(prompt_lens)
    noisy_pos = (prompt[:, None] + j[None, :])[:, None, :].expand(b, copies, n)

    # attention of noisy queries: clean keys strictly before the block start; noisy keys of the same copy and block
    block_start = prompt[:, None, None] + start[None]  # [b, K, n]
    clean_allowed = q[None, None, None, :] < block_start[..., None]  # [b, K, n, T]
    clean_allowed = clean_allowed.reshape(b, copies * n, t)
    copy_idx = torch.arange(copies).repeat_interleave(n)
    blk = block_of.reshape(copies * n)
    noisy_allowed = (copy_idx[:, None] == copy_idx[None, :]) & (blk[:, None] == blk[None, :])
    noisy_allowed = noisy_allowed[None].expand(b, -1, -1).clone()
    valid_k = valid.repeat(1, copies)  # [b, K*n]
    if drafting:  # a block's last position is no mask row of a decoding pass: nothing attends to it
        valid_k &= (in_block != block - 1).reshape(copies * n)[None]
    noisy_allowed &= valid_k[:, None, :]
    # rows outside the answer (and hidden ones) attend only to themselves (keeps softmax finite; they carry no loss)
    eye = torch.eye(copies * n, dtype=torch.bool)[None]
    noisy_allowed |= eye & ~valid_k[:, :, None]
    allowed = torch.cat([clean_allowed, noisy_allowed], dim=2)
    noisy_bias = additive_mask(allowed)[:, None]

    return Batch(
        clean_ids=clean_ids,
        clean_bias=clean_bias,
        noisy_ids=noisy_ids.reshape(b, copies * n),
        noisy_pos=noisy_pos.reshape(b, copies * n),
        noisy_bias=noisy_bias,
        targets=targets.reshape(b, copies * n),
        weights=weights.reshape(b, copies * n),
    )


def batch_logits(model: BlockDiffusionLM, batch: Batch) -> torch.Tensor:
    """Logits `[b, K*N, vocab]` of every noisy position: the clean pass (no gradient, adapter off) fills the cache,
    the noisy pass (adapter on) reads it. Position j's row predicts token j+1, as in decoding."""
    b, t = batch.clean_ids.shape
    cache = DynamicCache()
    with torch.no_grad():
        positions = torch.arange(t, device=batch.clean_ids.device)[None].expand(b, t)
        model(batch.clean_ids, positions, batch.clean_bias, torch.zeros_like(batch.clean_ids, dtype=torch.bool), cache)
    noisy = torch.ones_like(batch.noisy_ids, dtype=torch.bool)
    logits = model(batch.noisy_ids, batch.noisy_pos, batch.noisy_bias, noisy, cache)
    return logits[..., : model.vocab_size].float()


def block_diffusion_loss(model: BlockDiffusionLM, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean cross-entropy over supervised positions, plus accuracy for the progress bar."""
    logits = batch_logits(model, batch)
    supervised = batch.targets != -100
    per_token = F.cross_entropy(logits[supervised], batch.targets[supervised], reduction="none")
    weights = batch.weights[supervised]
    loss = (per_token * weights).sum() / weights.sum()
    with torch.no_grad():
        accuracy = (logits[supervised].argmax(-1) == batch.targets[supervised]).float().mean().item()
    return loss, {"loss": loss.item(), "acc": accuracy, "tokens": float(supervised.sum().item())}
