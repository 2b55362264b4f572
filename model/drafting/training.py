"""How a drafter learns its target: the target's own greedy answers, with the hidden rows its passes computed on the
way, then the drafter alone trains on them.

The answers and the rows come from the fast runtime's own passes (`FastPass.tapped_rows`, the decode kernel), several
prompts in one pass, each row computed as if alone: the rows the drafter trains on are the bits it will read when it
drafts, and the tokens are the ones the verifier will accept. The target is run once; training touches only the
drafter (a layer and a shortlist head), so it takes minutes where the target's passes would take hours.

Acceptance is measured the way decoding meets it: at every position of a held-out answer, the block drafted after the
context so far, compared with the answer's next tokens, cumulatively (a draft counts only when every draft before it
was right, as greedy verification accepts them).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model.decoding.step import Feed
from model.drafting.drafter import Drafter
from model.runtime.batching import KEY_MULTIPLE, PassRows, SlotCache
from model.runtime.fast_pass import FastPass


@dataclass(frozen=True, slots=True)
class Traced:
    """One prompt, its greedy answer, and the target's tapped rows of every token it fed (all but the last)."""

    tokens: list[int]  # prompt + answer
    prompt: int  # the prompt's length: the answer starts there
    tapped: torch.Tensor  # [len(tokens) - 1, taps, hidden] fp16


@torch.no_grad()  # not inference mode: the rows are training inputs
def traced_answers(
    fast: FastPass, prompts: Sequence[Sequence[int]], taps: Sequence[int], max_new_tokens: int,
    eos_ids: frozenset[int],
) -> list[Traced]:
    """Greedy answers to `prompts`, decoded together (one pass a step for all of them), with the rows of `taps`."""
    cache = SlotCache(len(prompts))
    tokens = [list(p) for p in prompts]
    tapped: list[list[torch.Tensor]] = [[] for _ in prompts]
    lengths = [0] * len(prompts)
    nexts: list[int] = []
    for slot, prompt in enumerate(prompts):  # prompts one by one: their lengths differ
        rows = PassRows.of([slot], [0], [Feed(clean=tuple(prompt))], KEY_MULTIPLE)
        h, rows_tapped = fast.tapped_rows(rows, cache, taps)
        tapped[slot].append(torch.stack(rows_tapped, dim=1).half())
        lengths[slot] = len(prompt)
        nexts.append(int(fast.logits(h[-1:].contiguous(), None).argmax(-1)))
    active = list(range(len(prompts)))
    for step in range(max_new_tokens):
        for slot in active:
            tokens[slot].append(nexts[slot])
        active = [s for s in active if nexts[s] not in eos_ids and step + 1 < max_new_tokens]
        if not active:
            break
        feeds = [Feed(clean=(nexts[s],)) for s in active]
        rows = PassRows.of(active, [lengths[s] for s in active], feeds, KEY_MULTIPLE)
        h, rows_tapped = fast.tapped_rows(rows, cache, taps)
        best = fast.logits(h, None).argmax(-1).tolist()
        layered = torch.stack(rows_tapped, dim=1).half()
        for i, slot in enumerate(active):
            tapped[slot].append(layered[i : i + 1])
            lengths[slot] += 1
            nexts[slot] = best[i]
    return [Traced(t, len(p), torch.cat(parts)) for t, p, parts in zip(tokens, prompts, tapped, strict=True)]


@dataclass(frozen=True, slots=True)
class Batch:
    tapped: torch.Tensor  # [B, N, taps, hidden] fp32
    embedded: torch.Tensor  # [B, A, hidden]: the anchors' tokens
    anchors: torch.Tensor  # [B, A]
    targets: torch.Tensor  # [B, A, block]: shortlist index of each draft's token, -1 none (past the end, not listed)
    valid: torch.Tensor  # [B, A, block] bool: a token exists there
    starts: torch.Tensor  # [B]: the first context position each sequence's blocks see


def make_batch(
    examples: Sequence[Traced], drafter: Drafter, embed: Callable[[torch.Tensor], torch.Tensor], anchors: int | None,
    rng: random.Random, context_from: str = "answer",
) -> Batch:
    """Blocks of `examples`: `anchors` random answer positions each (None: every one, for measuring). The context a
    block sees starts at the prompt's last token (`context_from` "answer", as decoding gives it: model/drafting/
    context.py) or at the prompt's first ("prompt")."""
    block = drafter.config.block
    n = max(len(ex.tokens) - 1 for ex in examples)
    taps, hidden = examples[0].tapped.shape[1:]
    picks = []
    for ex in examples:
        choices = list(range(ex.prompt, len(ex.tokens) - 1))  # a block's last token is an answer token with a next one
        picks.append(choices if anchors is None else [rng.choice(choices) for _ in range(anchors)])
    width = max(len(p) for p in picks)
    tapped = torch.zeros(len(examples), n, taps, hidden)
    anchor_t = torch.zeros(len(examples), width, dtype=torch.long)
    targets = torch.full((len(examples), width, block), -1, dtype=torch.long)
    valid = torch.zeros(len(examples), width, block, dtype=torch.bool)
    last = torch.zeros(len(examples), width, dtype=torch.long)
    index = drafter_index(drafter)
    for b, (ex, chosen) in enumerate(zip(examples, picks, strict=True)):
        tapped[b, : ex.tapped.shape[0]] = ex.tapped.float()
        tokens = torch.tensor(ex.tokens)
        for a, p in enumerate(chosen):
            anchor_t[b, a], last[b, a] = p, tokens[p]
            ahead = tokens[p + 1 : p + 1 + block]
            targets[b, a, : len(ahead)] = index[ahead]
            valid[b, a, : len(ahead)] = True
        valid[b, len(chosen):] = False
    starts = torch.tensor([ex.prompt - 1 if context_from == "answer" else 0 for ex in examples])
    return Batch(tapped, embed(last), anchor_t, targets, valid, starts)


def drafter_index(drafter: Drafter) -> torch.Tensor:
    """Token id -> its index in the drafter's shortlist, -1 where it is not listed."""
    index = torch.full((drafter.config.target.vocab,), -1, dtype=torch.long)
    index[drafter.shortlist] = torch.arange(drafter.shortlist.shape[0])
    return index


def shortlist_of(examples: Sequence[Traced], size: int, always: Sequence[int]) -> torch.Tensor:
    """The `size` tokens the examples' answers use most (and `always`: the end-of-answer ids), most used first."""
    counts: dict[int, int] = {}
    for ex in examples:
        for t in ex.tokens[ex.prompt:]:
            counts[t] = counts.get(t, 0) + 1
    ranked = [t for t in always] + [t for t, _ in sorted(counts.items(), key=lambda kv: -kv[1]) if t not in always]
    return torch.tensor(ranked[:size], dtype=torch.long)


def block_loss(drafter: Drafter, batch: Batch, near_weight: float) -> torch.Tensor:
    """Cross-entropy of each draft over the shortlist, a draft j tokens further weighted `near_weight`**j (a far
    draft counts only when the near ones were accepted); tokens outside the shortlist are not taught."""
    logits = drafter(batch.tapped, batch.embedded, batch.anchors, batch.starts)  # [B, A, block, S]
    weights = near_weight ** torch.arange(drafter.config.block, dtype=torch.float32)
    taught = batch.valid & (batch.targets >= 0)
    loss = F.cross_entropy(logits[taught], batch.targets[taught], reduction="none")
    w = weights.expand_as(batch.targets)[taught]
    return (loss * w).sum() / w.sum().clamp(min=1e-6)


@torch.no_grad()
def acceptance(
    drafter: Drafter, examples: Sequence[Traced], embed: Callable[[torch.Tensor], torch.Tensor], chunk: int = 8,
    context_from: str = "answer",
) -> list[float]:
    """P(the first j drafts are all right) for j = 1..block, over every answer position of `examples`."""
    right = torch.zeros(drafter.config.block)
    total = 0
    rng = random.Random(0)
    for start in range(0, len(examples), chunk):
        batch = make_batch(examples[start : start + chunk], drafter, embed, None, rng, context_from)
        best = drafter(batch.tapped, batch.embedded, batch.anchors, batch.starts).argmax(-1)  # [B, A, block]
        hit = (best == batch.targets) & batch.valid & (batch.targets >= 0)
        run = hit.long().cumprod(-1).bool()
        counted = batch.valid[..., 0]
        right += run[counted].float().sum(0)
        total += int(counted.sum())
    return (right / max(1, total)).tolist()


@dataclass(frozen=True, slots=True)
class TrainSettings:
    steps: int = 1500
    batch: int = 16  # sequences a step
    anchors: int = 16  # blocks per sequence a step
    lr: float = 1e-3
    near_weight: float = 0.8
    seed: int = 0
    minutes: float = 30.0
    context_from: str = "answer"  # make_batch's


def train_drafter(
    drafter: Drafter, examples: Sequence[Traced], embed: Callable[[torch.Tensor], torch.Tensor],
    settings: TrainSettings, start_step: int = 0, optimizer: torch.optim.Optimizer | None = None,
) -> Iterator[tuple[int, float, torch.optim.Optimizer]]:
    """Train, yielding (step, loss, optimizer) after each step; a cosine schedule over `settings.steps`."""
    rng = random.Random(settings.seed + start_step)
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = optimizer or torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    deadline = time.monotonic() + 60 * settings.minutes
    drafter.train()
    for step in range(start_step, settings.steps):
        if time.monotonic() > deadline:
            break
        for group in optimizer.param_groups:
            group["lr"] = settings.lr * 0.5 * (1 + torch.cos(torch.tensor(step / settings.steps * torch.pi))).item()
        batch = make_batch(rng.sample(list(examples), settings.batch), drafter, embed, settings.anchors, rng,
                           settings.context_from)
        loss = block_loss(drafter, batch, settings.near_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        yield step + 1, float(loss.detach()), optimizer
    drafter.eval()
