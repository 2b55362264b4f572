"""One answer's drafting state: the drafter's cache of the tokens committed so far, and the next block.

The context starts at the prompt's last token (the row whose output gave the answer's first token) and grows by the
tapped rows of every token the target's passes keep. The prompt before it is left out: a prompt's rows may come from
a cache another answer filled (model/runtime/batch_runner.py reuses them), and the drafter is trained with the same
context (model/drafting/training.py, `context_from`), so what it reads when it drafts is what it learned on.

Kept rows wait (`extend`) until the next `draft`, which runs them and the block in one pass: through the decode
kernel where it runs (model/drafting/native.py), else through the drafter's torch form.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from model.drafting.drafter import Drafter
from model.drafting.native import NativeDrafter
from model.runtime.batching import SlotCache


class DraftingContext:
    """`extend` with the tapped rows of kept tokens, then `draft` the block after them."""

    def __init__(self, drafter: Drafter, embed: Callable[[torch.Tensor], torch.Tensor], first_position: int,
                 native: NativeDrafter | None = None) -> None:
        """`embed(ids)` -> the target's embeddings `[n, hidden]`; `first_position`: the prompt's last token's;
        `native`: the drafter packed for the decode kernel (None: torch)."""
        self.drafter = drafter
        self.embed = embed
        self.first_position = first_position
        self.native = native
        self.length = 0  # context rows in the drafter's cache
        self._pending: list[torch.Tensor] = []  # fused context rows not yet run
        self._cache = SlotCache(1) if native is not None else None
        t = drafter.config.target
        self._keys = torch.empty(t.kv_heads, 0, t.head_dim)  # the torch form's cache
        self._values = torch.empty(t.kv_heads, 0, t.head_dim)

    @property
    def taps(self) -> tuple[int, ...]:
        return self.drafter.config.taps

    @property
    def block(self) -> int:
        return self.drafter.config.block

    @torch.inference_mode()
    def extend(self, tapped: torch.Tensor) -> None:
        """Add kept tokens' tapped rows `[n, taps, hidden]`, in order."""
        if tapped.shape[0]:
            fuse = self.native.fuse if self.native is not None else self.drafter.fuse
            self._pending.append(fuse(tapped))

    @torch.inference_mode()
    def draft(self, last: int) -> tuple[list[int], list[float]]:
        """The block after the context, whose first token is `last` (the target's newest, not yet in the context):
        (drafts, the drafter's probability of each)."""
        drafter = self.drafter
        context = torch.cat(self._pending) if self._pending else torch.empty(0, drafter.config.target.hidden)
        self._pending = []
        block = drafter.block_rows(self.embed(torch.tensor([last]))[0])
        if self.native is not None and self._cache is not None:
            logits = self.native.block_logits(context, block, self._cache, self.length, self.first_position)
        else:
            positions = torch.arange(self.first_position + self.length,
                                     self.first_position + self.length + context.shape[0])
            keys, values = drafter.keys_values(context, positions)
            self._keys, self._values = torch.cat([self._keys, keys], 1), torch.cat([self._values, values], 1)
            logits = drafter.block_logits(block, self.first_position + self.length + context.shape[0], self._keys,
                                          self._values)
        self.length += context.shape[0]
        best = torch.softmax(logits, dim=-1).max(dim=-1)
        return drafter.shortlist[best.indices].tolist(), best.values.tolist()
