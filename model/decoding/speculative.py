"""Self-speculative decoding: the teacher verifies, the adapter drafts, in the same forward pass (lossless).

A block-diffusion model built from an autoregressive checkpoint with a *gated* adapter
(model/bundled/block_diffusion.py) holds two models in one set of weights: with the gate off it is exactly the teacher,
with the gate on it fills masks. One pass feeds, after the KV cache::

    [ last committed token | k drafts d1..dk | m masks ]
      clean, causal, gate off (the teacher)   gate on, bidirectional among themselves, see every clean token

Row i of the clean part is the teacher's prediction for the token after it, so the pass checks all k drafts at once
(greedy: accept while the draft equals the teacher's argmax) and adds the teacher's own next token (the bonus). The
masks must sit right after the accepted tokens for their argmax to be the next pass's drafts, and which drafts will be
accepted is only known after the pass. So with `branches` the pass drafts one block of m masks after each of the k + 1
possible accepted prefixes (`Feed.after`: block a sees the last token and d1..da, at the positions right after da),
and the block after the accepted prefix gives the next drafts, whatever was rejected; a rejection no longer costs the
next pass its drafts. Mask rows are cheap next to the weights a pass reads (MODEL_CARD.md, "Pass cost"). Without
`branches` there is one block, after every draft, used only when all were accepted. The cache keeps what was accepted
and drops the rest. With m = 0 the same steps are plain autoregressive decoding (one token per pass, gate off), so both
modes share every line but the drafting. An answer is a `SpeculativeDecoding`, a step object that the batch runner
(model/runtime/batch_runner.py) drives: `feed()`, one pass, `consume(logits)`, keep the accepted tokens.

At temperature > 0 the rule is speculative sampling (Leviathan et al. 2023, gpt-fast's `speculative_decode`): accept a
draft d with probability min(1, p(d) / q(d)); on rejection sample from the residual max(0, p - q). Drafts here are the
masks' argmax, so q is one-hot and the rule becomes: accept with probability p(d), else sample p with d removed. The
output then follows the teacher's distribution exactly.

The speech guard (model/decoding/speech_guard.py) edits the teacher's logits as a pure function of the prompt and the
answer so far. It is applied to every verification row with that row's own prefix (`guarded`), so autoregressive and
self-speculative decoding stay token-for-token equal with it on. A response format's grammar (model/decoding/grammar.py)
masks the same rows the same way (`constrain_rows`), after the guard: a draft it refuses is not accepted, and once the
JSON is closed only an end-of-answer token is left.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

import torch

from model.decoding.draft_policy import DraftPolicy
from model.decoding.grammar import Grammar, constrain_drafts, constrain_rows
from model.decoding.refinement import Refinement
from model.decoding.speech_guard import SpeechGuard, guarded
from model.decoding.step import Drafts, Feed
from model.errors import ModelError
from model.process import watch


def accept_greedy(drafts: Sequence[int], logits: torch.Tensor) -> tuple[int, int]:
    """Leading drafts that equal the teacher's argmax, and the teacher's token after them.

    drafts: [k], logits: [k + 1, V] -> (accepted, next token). The argmax of CPU rows is numpy's (the first of equal
    maxima, as torch's): torch's takes ~4x as long on a 49K vocabulary, ~45 µs a row, every decoding step.
    """
    rows = logits.numpy().argmax(-1) if logits.device.type == "cpu" else logits.argmax(-1).cpu()
    target = rows.tolist()
    accepted = 0
    while accepted < len(drafts) and int(drafts[accepted]) == target[accepted]:
        accepted += 1
    return accepted, target[accepted]


def token_probabilities(probs: torch.Tensor, tokens: Sequence[int]) -> list[float]:
    """`probs[i, tokens[i]]` for each row i of host-side probabilities (a pass's logits come back to the host), as
    Python floats, read through numpy: torch's gather, the index tensor it needs and `tolist` cost ~60 us a decoding
    step right after the pass, whose weights' stream has evicted torch's code and data from the caches; the values
    are the same floats."""
    rows = probs.numpy()
    return [float(rows[i, token]) for i, token in enumerate(tokens)]


def accept_sampled(
    drafts: torch.Tensor, logits: torch.Tensor, temperature: float, generator: torch.Generator
) -> tuple[int, int]:
    """Speculative sampling with deterministic drafts (q one-hot): the output follows softmax(logits / temperature).

    drafts: [k] long, logits: [k + 1, V] -> (accepted, next token).
    """
    p = torch.softmax(logits.double() / temperature, dim=-1)  # [k + 1, V]; float64 so tiny residuals stay exact
    for i, draft in enumerate(drafts.tolist()):
        if torch.rand((), dtype=torch.float64, generator=generator) < p[i, draft]:  # min(1, p / q) with q = 1
            continue
        residual = p[i].clone()
        residual[draft] = 0.0  # max(0, p - q), renormalized by multinomial
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[-1], 1, generator=generator))


def first_eos(tokens: list[int], eos_ids: frozenset[int]) -> int | None:
    return next((i for i, token in enumerate(tokens) if token in eos_ids), None)


class SpeculativeDecoding:
    """One answer's self-speculative (or, with `masks` = 0, autoregressive) decoding as a step function: `feed()`
    says which tokens the next pass needs, `consume(...)` takes that pass's logits and returns the `Refinement` and how
    many of the fed tokens the cache keeps. model/runtime/batch_runner.py drives it, alone or beside other answers in
    one forward. A Refinement's committed tokens are verified by the teacher; the uncommitted ones after them are the
    drafts for the next pass.
    """

    def __init__(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        masks: int,
        mask_id: int,
        eos_ids: frozenset[int],
        temperature: float = 0.0,
        seed: int | None = None,
        guard: SpeechGuard | None = None,
        branches: bool = True,
        policy: DraftPolicy | None = None,
        grammar: Grammar | None = None,
        draft_lead: int = 0,
        drafting: Drafts | None = None,
    ) -> None:
        if not prompt_ids:
            raise ModelError("the prompt is empty: nothing to condition the answer on")
        if max_new_tokens < 1:
            raise ModelError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if masks < 0:
            raise ModelError(f"the number of mask tokens per pass must be >= 0, got {masks}")
        self.prompt = list(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.masks = masks
        self.mask_id = mask_id
        self.eos_ids = frozenset(eos_ids)
        self.temperature = temperature
        self.guard = guard
        self.grammar = grammar  # the answer's response format: its state follows `answer`
        self.branches = branches  # a block of masks after every draft (see the module docstring), when alone
        self.policy = policy  # None: `masks` every pass; else the policy's choice (up to `masks`) for lone passes
        self.draft_lead = draft_lead  # the answer's first tokens: drafted (`masks` a pass) whatever the policy says
        # The drafter (model/drafting/) instead of mask rows: the pass verifies its drafts with clean rows only, and
        # the drafter drafts the next block after it, from the rows the pass tapped (`take_taps`)
        self.drafting = drafting
        self._tapped: torch.Tensor | None = None
        self._drafted = True  # whether `drafts` follow `last` (the drafter runs only for a pass that verifies drafts)
        self._branched = False  # whether the last feed() drafted a block after every draft
        self._fed_masks = masks  # masks per block in the last feed()
        # When the last consume() returned, and whether the answer has been alone in its passes since: a layout's cost
        # for the policy is the whole step, pass and consume() and all, from one consume() to the next
        self._consumed_at: float | None = None
        self._alone = False
        self.generator = torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))
        self.answer: list[int] = []  # verified tokens
        self.confidence: list[float] = []  # the teacher's probability of each verified token
        self.drafts: list[int] = []  # [k] the masks' guesses for the tokens after `answer`
        self.draft_conf: list[float] = []
        self.last = self.prompt[-1]  # the newest token not yet in the cache
        self.lead: tuple[int, ...] = ()  # prompt tokens before `last` that the first pass encodes (`fold_prompt`)
        self.step = 0

    @property
    def cached_prompt(self) -> list[int]:
        """What the cache must hold before the first pass: every prompt token but the last (the first pass feeds it,
        and its row predicts the answer's first token)."""
        return self.prompt[:-1]

    def fold_prompt(self, tokens: Sequence[int]) -> None:
        """Encode `tokens` (the prompt's uncached part before its last token) in the first pass, ahead of the last
        token, instead of in a prefill of their own: a voice turn's new words then cost no extra forward."""
        self.lead = tuple(tokens)

    def feed(self, crowd: int = 1) -> Feed:
        """`[last committed token | k drafts]` clean, then m masks: one block after the drafts, or with `branches`
        one after each of the k + 1 prefixes the pass may accept. Only when the answer has the pass to itself
        (`crowd` 1): in a batched pass the extra mask rows of every answer cost more than they gain (bench_api, 4
        clients: 26.2 tokens/s with one block, 21.8 with a block after every draft). With the adaptive policy a
        batched pass drafts nothing: on a CPU a pass of several answers is bound by the integer units, not by reading
        the weights, so every row costs about the same (bench_lm --pass-costs: 16 rows of one answer and 16 answers'
        rows cost alike), and a clean row of another answer yields a token where a draft and its mask yield half of
        one. Where the policy finds draft rows nearly free (`lead_pays`), the answer's first `draft_lead` tokens are
        drafted alone or batched, whatever it would choose, in one block after the drafts (a voice answer's first
        phrase is spoken from them: the cheapest rows that show it). A folded prompt's tokens (`fold_prompt`) come
        first in the first pass."""
        masks = self.masks
        self._alone = self._alone and crowd <= 1
        leading = self._leading()
        if self.policy is not None and masks and not leading:
            masks = 0 if crowd > 1 else min(masks, self.policy.choose())
        self._fed_masks = masks
        if self.drafting is not None and masks and not self._drafted:
            self.drafts, self.draft_conf = self.drafting.draft(self.last)
            self._drafted = True
        self.drafts = self.drafts[: min(masks, self.max_new_tokens - len(self.answer) - 1)]  # k + 1 new at most
        clean = (*self.lead, self.last, *self.drafts)
        if self.drafting is not None:
            self._branched = False
            return Feed(clean=clean, taps=self.drafting.taps)
        self._branched = self.branches and masks > 0 and crowd <= 1 and not leading
        if not self._branched:
            return Feed(clean=clean, noisy=(self.mask_id,) * masks, drafts=True)
        after = tuple(g for g in range(len(self.lead) + 1, len(clean) + 1) for _ in range(masks))
        return Feed(clean=clean, noisy=(self.mask_id,) * len(after), after=after, drafts=True)

    def _leading(self) -> bool:
        """Whether the next pass drafts the answer's lead whatever the policy chooses (see `feed`)."""
        return len(self.answer) < self.draft_lead and self.policy is not None and self.policy.lead_pays()

    def take_taps(self, tapped: torch.Tensor) -> None:
        """The pass's tapped rows of this answer's clean rows (`ReadsTaps`), for the drafter's context."""
        self._tapped = tapped

    def untimed(self) -> None:
        """The pass just fed is not a usual one (`TimesItsPasses`): the step it ends is not timed for the policy."""
        self._alone = False

    def consume(
        self, clean_logits: torch.Tensor, mask_logits: torch.Tensor, elapsed_s: float, cancelled: bool = False
    ) -> tuple[Refinement, int]:
        """The pass's teacher logits `[k + 1, V]` (after a folded prompt's rows) and mask logits `[m, V]` ->
        (Refinement, clean tokens to keep)."""
        drafts, answer = self.drafts, self.answer
        lead, self.lead = len(self.lead), ()
        logits = guarded(clean_logits[lead:], answer, drafts, self.guard, copy=self.grammar is not None)
        if self.grammar is not None:
            with watch.span(watch.GRAMMAR):
                constrain_rows(logits, clean_logits[lead:] if self.guard is not None else None, drafts, self.grammar)
        if self.temperature == 0:
            accepted, bonus = accept_greedy(drafts, logits)
        else:
            accepted, bonus = accept_sampled(torch.tensor(drafts, dtype=torch.long), logits, self.temperature,
                                             self.generator)
        new = [*drafts[:accepted], bonus]  # `last` and the accepted drafts are kept; the bonus is fed next pass
        probs = torch.softmax(logits[: accepted + 1], dim=-1)  # [accepted + 1, V]
        new_conf = token_probabilities(probs, new)

        stop = first_eos(new, self.eos_ids)
        if stop is not None:
            new, new_conf = new[: stop + 1], new_conf[: stop + 1]
        answer += new
        self.confidence += new_conf
        if self.grammar is not None:
            self.grammar.advance(new)
        self.last = answer[-1]

        # Drafts from the masks drafted after the right tokens: the block after the accepted prefix (without
        # branches there is one block, after every draft).
        masks = self._fed_masks
        now = time.perf_counter()
        if self.policy is not None:  # a lone step in the steady layout of `masks` says what that layout costs
            steady = not lead and len(drafts) == masks and (self._branched or not masks or self.drafting is not None)
            step_s = now - self._consumed_at if self._consumed_at is not None and self._alone else None
            self.policy.observe(masks, len(drafts), accepted, step_s * 1e3 if steady and step_s else None)
        self._consumed_at, self._alone = now, True
        block = accepted if self._branched else 0
        if self.drafting is not None:
            if self._tapped is None:
                raise ModelError("a drafting pass came back without the rows its drafter reads")
            self.drafting.extend(self._tapped[lead : lead + 1 + accepted])  # the kept rows from `last` on
            self._tapped = None
            # drafted now when every pass verifies drafts, or a voice answer's lead is drafted (`leading` in `feed`:
            # its first phrase is rendered from them); else by the next `feed`, only if its pass verifies drafts.
            # Shown to speech on every CPU, the drafts of the lead got 0.80-0.83 speculative-TTS hits a turn on the
            # 2-core AVX2 EPYC, but the renders of drafts took the cores from the passes that commit them: heard p50
            # 904-1,110 ms against 720-858 without (30 held-out turns each, one sitting; docs/drafter.md)
            self.drafts, self.draft_conf, self._drafted = [], [], stop is not None
            if stop is None and (self.policy is None or self._leading()):
                self.drafts, self.draft_conf = self.drafting.draft(self.last)
                self._drafted = True
        elif masks and (self._branched or accepted == len(drafts)) and stop is None:
            block_logits = mask_logits[block * masks : (block + 1) * masks].float()
            if self.grammar is not None:  # drafts the grammar allows, after the answer as committed
                block_logits = block_logits.clone()
                with watch.span(watch.GRAMMAR):
                    constrain_drafts(block_logits, self.grammar)
            mask_probs = torch.softmax(block_logits, dim=-1)
            best = mask_probs.max(dim=-1)  # [m]
            self.drafts, self.draft_conf = best.indices.tolist(), best.values.tolist()
        else:
            self.drafts, self.draft_conf = [], []

        reason = None
        if stop is not None:
            reason = "stop"
        elif len(answer) >= self.max_new_tokens:
            reason = "length"
        elif cancelled:
            reason = "cancelled"
        ahead = [] if reason else self.drafts[: self.max_new_tokens - len(answer)]
        refinement = Refinement(
            step=self.step,
            block=self.step,
            tokens=tuple(answer + ahead),
            committed=(True,) * len(answer) + (False,) * len(ahead),
            confidence=tuple(self.confidence + self.draft_conf[: len(ahead)]),
            elapsed_s=elapsed_s,
            done=reason is not None,
            finish_reason=reason,
            eos_ids=self.eos_ids,
        )
        self.step += 1
        return refinement, lead + 1 + accepted

