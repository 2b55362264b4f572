"""Masked-diffusion sampler: semi-autoregressive blocks, each refined over a few parallel passes.

Read it top to bottom: small pure helpers (schedule, sampling, commit choice), then `generate`, whose two nested loops
(blocks, then denoising passes) are the whole algorithm. The sampler owns the answer canvas and the commit policy; the
network, its attention pattern and its cache live behind the `Denoiser` protocol (model/decoding/denoiser.py).
`generate` drives external checkpoints, which cannot batch; on the bundled block-diffusion model the same
`DiffusionDecoding` steps are driven by its batch runner (`DiffusionSequence`, model/decoding/block_passes.py).

Commit policy per pass, in one place so it can be checked:

- Fixed budget (``threshold=None``): the block's `block_length` masked positions are committed over `steps_per_block`
  passes, split as evenly as the linear schedule gives (LLaDA's get_num_transfer_tokens): pass k commits
  ``B // S + (1 if k < B % S else 0)`` positions, the most confident ones ("low_confidence"), random ones ("random"),
  or the leftmost ones ("left_to_right": for block-diffusion models adapted from an autoregressive checkpoint, whose
  prediction of a position is best once everything left of it is final; with a threshold it commits the confident run
  that continues the committed prefix, never a confident position right of one still masked).
- Threshold (``threshold=t``, Fast-dLLM): every masked position whose confidence is > t is committed, and never fewer
  than the fixed budget's count for that pass. With ``steps_per_block = block_length`` that floor is one token per pass,
  exactly Fast-dLLM's "at least one"; with fewer steps the floor guarantees the block is done within `steps_per_block`
  passes, so the budget is an upper bound on passes per block, never a target.
- Under a grammar (a response format or tool calls, model/decoding/grammar.py): commits run left to right. Each pass
  proposes the block's masked positions in order, each from the grammar's mask in the state after the tokens left of
  it (committed ones, then this pass's proposals), so the proposals spell a valid continuation; the pass commits the
  leftmost masked position and the run right after it that the rule above chose, and at least the budget's count.
  A position is committed only once everything before it is, so the committed answer is always a prefix the grammar
  accepts. A token the grammar forces (a quote, a colon) has confidence 1 and commits in the same pass as its
  neighbours; any other is judged by the model's own probability of it, before the grammar's mask renormalised its
  row.
- End of sequence: once an EOS is committed, the masked positions after it inside the block are filled with EOS and
  committed in the same pass (LLaDA's convention: the model is trained to pad with EOS). Generation stops as soon as a
  committed EOS has only committed positions before it; no block after it ever runs.

Committed tokens never change. Each pass yields a `Refinement` holding committed tokens and the pass's argmax guesses
elsewhere, never the mask id.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from model.decoding.denoiser import Denoiser
from model.decoding.grammar import Grammar, GrammarError
from model.decoding.options import PLAIN, GenerationOptions
from model.decoding.refinement import Refinement
from model.decoding.speech_guard import SpeechGuard
from model.errors import ModelError
from model.process import watch

REMASKING = ("low_confidence", "random", "left_to_right")
DECODING_MODES = ("self-speculative", "autoregressive", "diffusion")
DRAFT_LAYOUTS = ("fixed", "adaptive")


@dataclass(frozen=True, slots=True)
class SamplerConfig:
    """How the model spends its passes: the model's own settings, whatever the request. What one caller asks of its
    answer (temperature, seed, logit rules) is its `GenerationOptions`. Validated on construction; lengths are checked
    again in `generate`."""

    block_length: int = 32  # B; B = max_new_tokens decodes the whole answer as one block
    steps_per_block: int = 32  # pass budget per block (upper bound when `threshold` is set)
    remasking: str = "low_confidence"  # which masked positions a fixed budget commits (see REMASKING)
    threshold: float | None = None  # Fast-dLLM: commit every masked position with confidence > threshold
    cfg_scale: float = 0.0  # classifier-free guidance; > 0 needs an unconditional denoiser (see `generate`)
    use_cache: bool = True  # False: re-encode the prompt every pass (`Denoiser.start`, the bundled `BlockPasses`)
    # "diffusion": this file's threshold/budget sampler; "self-speculative" / "autoregressive":
    # model/decoding/speculative.py
    decoding: str = "diffusion"
    draft_masks: int = 4  # self-speculative: mask tokens per pass, i.e. how many tokens it drafts ahead
    draft_branches: bool = True  # self-speculative: a block of masks after every draft (model/decoding/speculative.py)
    # self-speculative: "fixed" drafts `draft_masks` every pass; "adaptive" lets a lone answer draft 0..draft_masks, as
    # many as pay on this machine (model/decoding/draft_policy.py)
    draft_layout: str = "fixed"

    def __post_init__(self) -> None:
        if self.block_length < 1:
            raise ModelError(f"block_length must be at least 1, got {self.block_length}")
        if not 1 <= self.steps_per_block <= self.block_length:
            raise ModelError(
                f"steps_per_block must be between 1 and block_length ({self.block_length}), got {self.steps_per_block}:"
                " a pass that commits nothing would be wasted"
            )
        if self.remasking not in REMASKING:
            raise ModelError(f"remasking must be one of {REMASKING}, got {self.remasking!r}")
        if self.threshold is not None and not 0.0 <= self.threshold < 1.0:
            raise ModelError(f"threshold must be in [0, 1), got {self.threshold}")
        if self.cfg_scale < 0:
            raise ModelError(f"cfg_scale must be >= 0, got {self.cfg_scale}")
        if self.decoding not in DECODING_MODES:
            raise ModelError(f"decoding must be one of {DECODING_MODES}, got {self.decoding!r}")
        if self.draft_layout not in DRAFT_LAYOUTS:
            raise ModelError(f"draft_layout must be one of {DRAFT_LAYOUTS}, got {self.draft_layout!r}")
        if self.draft_masks < 1:
            raise ModelError(f"draft_masks must be at least 1, got {self.draft_masks}")


def commit_schedule(masked: int, steps: int) -> list[int]:
    """Tokens to commit at each of `steps` passes so that `masked` positions are done, as evenly as possible.

    The linear noise schedule removes the same expected number of masks per pass; the remainder goes to the first
    passes so the schedule is front-loaded by at most one token.
    """
    base, remainder = divmod(masked, steps)
    return [base + (1 if step < remainder else 0) for step in range(steps)]


def sample_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """Pick one token per position: argmax at temperature 0, else Gumbel-max sampling.

    logits: [L, V] float32 -> [L] long. The Gumbel noise is drawn in float64: in float32, -log(-log(u)) for u near 1
    saturates and low-probability tokens are sampled far too rarely (the LLaDA paper's observation).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    uniform = torch.rand(logits.shape, dtype=torch.float64, generator=generator).clamp_(1e-20, 1.0 - 1e-16)
    gumbel = -torch.log(-torch.log(uniform))  # [L, V]
    return (logits.double() / temperature + gumbel).argmax(dim=-1)


def token_confidence(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Probability the model gives each chosen token. logits: [L, V], tokens: [L] -> [L] float32."""
    probs = torch.softmax(logits.float(), dim=-1)
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def choose_commits(
    confidence: torch.Tensor,
    masked: torch.Tensor,
    budget: int,
    config: SamplerConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """Boolean [L] of the masked positions to commit in this pass (see the module docstring for the policy).

    confidence: [L] float, masked: [L] bool. Never selects a committed position; selects min(budget, masked) at least.
    """
    if config.remasking == "random":
        score = torch.rand(confidence.shape, generator=generator)
    elif config.remasking == "left_to_right":
        score = torch.arange(confidence.shape[0], 0, -1, dtype=torch.float32)  # leftmost first
    else:
        score = confidence.clone()
    score[~masked] = -1.0  # committed positions are never re-chosen
    count = min(budget, int(masked.sum()))
    chosen = torch.zeros_like(masked)
    if count > 0:
        chosen[score.topk(count).indices] = True
    if config.threshold is not None and config.remasking == "left_to_right":
        # Only a confident run that continues the committed prefix: a confident guess to the right of a position
        # still masked was made without knowing that position, and is how parallel decoding stutters ("of of").
        for index in range(confidence.shape[0]):
            if masked[index] and not chosen[index] and confidence[index] <= config.threshold:
                break
            chosen[index] |= bool(masked[index])
    elif config.threshold is not None:
        chosen |= masked & (confidence > config.threshold)
        if not chosen.any() and masked.any():  # Fast-dLLM: always at least one per pass
            best = torch.where(masked, confidence, torch.full_like(confidence, -1.0)).argmax()
            chosen[best] = True
    return chosen


def first_stop(canvas: torch.Tensor, committed: torch.Tensor, eos: torch.Tensor) -> int | None:
    """Index of the first committed EOS if every position before it is committed, else None.

    canvas: [N] long, committed: [N] bool, eos: [E] long (the model's EOS ids).
    """
    is_eos = committed & torch.isin(canvas, eos)
    if not is_eos.any():
        return None
    index = int(is_eos.nonzero()[0])
    return index if bool(committed[:index].all()) else None


def fill_after_eos(canvas: torch.Tensor, committed: torch.Tensor, eos: torch.Tensor, lo: int, hi: int) -> None:
    """Commit EOS into the still-masked positions after the first committed EOS of block [lo, hi) (in place)."""
    block_eos = committed[lo:hi] & torch.isin(canvas[lo:hi], eos)
    if not block_eos.any():
        return
    start = lo + int(block_eos.nonzero()[0]) + 1
    tail = ~committed[start:hi]
    canvas[start:hi][tail] = int(eos[0])
    committed[start:hi] |= tail


def guarded_proposal(
    logits: torch.Tensor,
    before: list[int],
    block: torch.Tensor,
    done: torch.Tensor,
    guard: SpeechGuard,
    temperature: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """`sample_tokens` left to right through the block, each masked position guarded given the tokens left of it.

    logits: [B, V] (edited in place), block: [B] long, done: [B] bool (committed) -> [B] long.
    """
    prefix, proposal = list(before), block.clone()
    for i in range(block.shape[0]):
        if not done[i]:
            guard.apply(logits[i], prefix)
            proposal[i] = sample_tokens(logits[i : i + 1], temperature, generator)[0]
        prefix.append(int(proposal[i]))
    return proposal


def grammar_proposal(
    logits: torch.Tensor,
    block: torch.Tensor,
    done: torch.Tensor,
    grammar: Grammar,
    guard: SpeechGuard | None,
    before: list[int],
    temperature: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, int]:
    """Proposals for a block whose committed positions are a prefix (commits under a grammar run left to right), each
    masked position guarded (`guard`, given the tokens left of it) and then masked by the grammar in the state after
    the proposals before it. The grammar's state is the committed answer's, before and after (proposals are consumed
    tentatively and rolled back). Once a proposal ends the answer (EOS), the positions after it propose EOS too.

    logits: [B, V] (edited in place), block: [B] long, done: [B] bool -> ([B] long, how many masked positions from
    the first one are proposals the grammar accepts in sequence: only those may be committed).
    """
    prefix, proposal = list(before), block.clone()
    consumed = valid = 0
    end: int | None = None  # the end-of-answer token proposed, once one is
    for i in range(block.shape[0]):
        if done[i]:
            prefix.append(int(proposal[i]))
            continue
        if end is not None:
            proposal[i] = end
            valid += 1
            continue
        raw = logits[i].clone() if guard is not None else None
        if guard is not None:
            guard.apply(logits[i], prefix)
        grammar.mask(logits[i], raw)
        token = int(sample_tokens(logits[i : i + 1], temperature, generator)[0])
        proposal[i] = token
        prefix.append(token)
        if grammar.accepts(token):
            consumed += 1
        elif bool(torch.isfinite(logits[i, token])):  # allowed, not consumed: the end after a closed structure
            end = token
        else:  # the grammar left nothing to choose: nothing from here on may be committed this pass
            proposal[i:] = torch.where(done[i:], block[i:], sample_tokens(logits[i:], temperature, generator))
            break
        valid += 1
    grammar.rollback(consumed)
    return proposal, valid


def leftmost_commits(chosen: torch.Tensor, masked: torch.Tensor, budget: int, valid: int) -> torch.Tensor:
    """Under a grammar, the commits of a pass as a run from the block's first masked position: the run `chosen`
    continues from there, at least `budget` positions, at most the `valid` proposals (see `grammar_proposal`).

    chosen, masked: [B] bool (committed positions are a prefix of the block) -> [B] bool.
    """
    first = int(masked.long().argmax())
    run = 0
    while first + run < chosen.shape[0] and chosen[first + run]:
        run += 1
    count = min(max(run, budget, 1), valid, int(masked.sum()))
    if count < 1:
        raise GrammarError("the grammar allows no token here")
    commits = torch.zeros_like(masked)
    commits[first : first + count] = True
    return commits


def validate_request(denoiser: Denoiser, prompt_ids: list[int], max_new_tokens: int, config: SamplerConfig) -> None:
    """Raise `ModelError` with a clear message for anything `generate` cannot do."""
    if not prompt_ids:
        raise ModelError("the prompt is empty: a diffusion LM needs at least one prompt token to condition on")
    if max_new_tokens < 1:
        raise ModelError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if max_new_tokens % config.block_length:
        raise ModelError(
            f"max_new_tokens ({max_new_tokens}) must be a whole number of blocks of {config.block_length} tokens"
        )
    mask_id = denoiser.mask_id
    if mask_id is None or not 0 <= mask_id < denoiser.vocab_size:
        raise ModelError(f"this model has no usable mask token (mask_id={mask_id!r}): it cannot drive a masked sampler")
    if not denoiser.eos_ids:
        raise ModelError("this model declares no end-of-sequence token")
    if any(not 0 <= token < denoiser.vocab_size for token in prompt_ids):
        raise ModelError(f"the prompt holds token ids outside the model's vocabulary of {denoiser.vocab_size}")


class DiffusionDecoding:
    """One answer's masked-diffusion decoding as a step function: the canvas and commit state of the answer, the
    active block `[lo, hi)`, and `consume(logits)` for each pass over that block. `generate` drives one answer through
    any `Denoiser`; model/runtime/batch_runner.py drives every answer of a block-diffusion model, many in one forward.

    Blocks run left to right; within a block each pass commits by the schedule (and threshold), and the block is
    finished (`finished_block` set) once every position of it is committed.
    """

    def __init__(
        self, mask_id: int, eos_ids: frozenset[int], max_new_tokens: int, config: SamplerConfig,
        options: GenerationOptions = PLAIN, guard: SpeechGuard | None = None, grammar: Grammar | None = None,
    ) -> None:
        self.mask_id = mask_id
        self.eos_ids = frozenset(eos_ids)
        self.config = config
        self.temperature = options.temperature
        self.guard = guard
        self.grammar = grammar  # the answer's response format or tool calls: its state follows the committed prefix
        seed = options.seed if options.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed)
        self.eos = torch.tensor(sorted(self.eos_ids), dtype=torch.long)  # [E]
        self.canvas = torch.full((max_new_tokens,), mask_id, dtype=torch.long)  # [N] committed tokens, mask elsewhere
        self.committed = torch.zeros(max_new_tokens, dtype=torch.bool)  # [N]
        self.guess = self.canvas.clone()  # [N] latest argmax guess (or committed token): what a reader sees
        self.confidence = torch.zeros(max_new_tokens, dtype=torch.float32)  # [N]
        self.num_blocks = max_new_tokens // config.block_length
        self.block = 0
        self.schedule = commit_schedule(config.block_length, config.steps_per_block)
        self.pass_in_block = 0
        self.step = 0
        self.finished_block: tuple[int, int] | None = None  # set by the pass that finished a block, until the next

    @property
    def lo(self) -> int:
        return self.block * self.config.block_length

    @property
    def hi(self) -> int:
        return self.lo + self.config.block_length

    def consume(self, logits: torch.Tensor, elapsed_s: float, cancelled: bool = False) -> Refinement:
        """One pass's logits `[hi - lo, V]` for the active block (edited in place) -> this pass's Refinement."""
        config, lo, hi = self.config, self.lo, self.hi
        canvas, committed, eos = self.canvas, self.committed, self.eos
        logits[:, self.mask_id] = -torch.inf  # the mask is never an answer, whatever the adapter did
        budget = self.schedule[self.pass_in_block]
        valid = hi - lo
        if self.grammar is not None:
            unmasked = logits.clone()
            with watch.span(watch.GRAMMAR):
                proposal, valid = grammar_proposal(logits, canvas[lo:hi], committed[lo:hi], self.grammar, self.guard,
                                                   canvas[:lo].tolist(), self.temperature, self.generator)
        elif self.guard is None:
            proposal = sample_tokens(logits, self.temperature, self.generator)  # [B]
        else:
            proposal = guarded_proposal(logits, canvas[:lo].tolist(), canvas[lo:hi], committed[lo:hi], self.guard,
                                        self.temperature, self.generator)
        proposal_conf = token_confidence(logits, proposal)  # [B]
        if self.grammar is not None:
            # A token the grammar forces is certain; any other is judged by the model's own belief, not by what is
            # left of it once the grammar's mask has renormalised its row (the threshold is the model's)
            forced = torch.isfinite(logits).sum(dim=-1) == 1
            proposal_conf = torch.where(forced, proposal_conf, token_confidence(unmasked, proposal))
        masked = ~committed[lo:hi]  # [B]
        chosen = choose_commits(proposal_conf, masked, budget, config, self.generator)
        if self.grammar is not None:
            chosen = leftmost_commits(chosen, masked, budget, valid)
            self.grammar.advance(proposal[chosen].tolist())

        self.guess[lo:hi] = torch.where(masked, proposal, canvas[lo:hi])
        self.confidence[lo:hi] = torch.where(masked, proposal_conf, self.confidence[lo:hi])
        canvas[lo:hi][chosen] = proposal[chosen]
        committed[lo:hi] |= chosen
        fill_after_eos(canvas, committed, eos, lo, hi)
        self.guess[lo:hi] = torch.where(committed[lo:hi], canvas[lo:hi], self.guess[lo:hi])

        reason = None
        if first_stop(canvas[:hi], committed[:hi], eos) is not None:
            reason = "stop"
        elif self.block == self.num_blocks - 1 and bool(committed.all()):
            reason = "length"
        elif cancelled:
            reason = "cancelled"
        shown = torch.where(committed[:hi], canvas[:hi], self.guess[:hi])
        refinement = Refinement(
            step=self.step,
            block=self.block,
            tokens=tuple(shown.tolist()),
            committed=tuple(committed[:hi].tolist()),
            confidence=tuple(self.confidence[:hi].tolist()),
            elapsed_s=elapsed_s,
            done=reason is not None,
            finish_reason=reason,
            eos_ids=self.eos_ids,
        )
        self.step += 1
        self.pass_in_block += 1
        self.finished_block = None
        # The schedule commits the whole block by its last pass; EOS fill or the threshold may finish it sooner.
        if reason is None and bool(committed[lo:hi].all()):
            self.finished_block = (lo, hi)
            self.block += 1
            self.pass_in_block = 0
        return refinement


def generate(
    denoiser: Denoiser,
    prompt_ids: list[int],
    max_new_tokens: int,
    config: SamplerConfig,
    cancel: threading.Event | None = None,
    unconditional: Denoiser | None = None,
    guard: SpeechGuard | None = None,
    options: GenerationOptions = PLAIN,
    grammar: Grammar | None = None,
) -> Iterator[Refinement]:
    """Denoise an answer of at most `max_new_tokens` after `prompt_ids`, yielding one `Refinement` per pass.

    Classifier-free guidance (``config.cfg_scale > 0``) needs `unconditional`: a second denoiser over the same network
    with its own state (adapters offer `fork()`). It is started on the prompt with every token replaced by the mask id,
    as in LLaDA, and the logits are combined as ``uncond + (scale + 1) * (cond - uncond)``.
    Setting `cancel` stops after the pass in flight; that pass's Refinement is the last, with finish_reason "cancelled".
    `guard` (no repeated n-grams, end at a sentence end) edits each masked position's logits given the tokens to its
    left (committed, or this pass's guesses), the same rule the autoregressive and self-speculative modes apply.
    `options`: the caller's temperature and seed. `grammar`: the answer's response format or tool calls (committed
    left to right, each token one the grammar allows: see the module docstring).
    """
    validate_request(denoiser, prompt_ids, max_new_tokens, config)
    if config.cfg_scale > 0 and unconditional is None:
        raise ModelError("cfg_scale > 0 needs an unconditional denoiser (e.g. denoiser.fork())")
    guided = config.cfg_scale > 0 and unconditional is not None
    decoding = DiffusionDecoding(denoiser.mask_id, frozenset(denoiser.eos_ids), max_new_tokens, config, options, guard,
                                 grammar)
    denoiser.start(list(prompt_ids), max_new_tokens, config.use_cache)
    if guided:
        unconditional.start([denoiser.mask_id] * len(prompt_ids), max_new_tokens, config.use_cache)
    while True:
        started = time.perf_counter()
        lo, hi = decoding.lo, decoding.hi
        # [B, V]; cloned because an adapter may hand back an inference-mode tensor, which cannot be edited in place
        logits = denoiser.block_logits(decoding.canvas, lo, hi).float().cpu().clone()
        if guided:
            uncond = unconditional.block_logits(decoding.canvas, lo, hi).float().cpu()
            logits = uncond + (config.cfg_scale + 1.0) * (logits - uncond)
        cancelled = cancel is not None and cancel.is_set()
        refinement = decoding.consume(logits, time.perf_counter() - started, cancelled)
        yield refinement
        if refinement.done:
            return
        if decoding.finished_block is not None:
            denoiser.finish_block(decoding.canvas, lo, hi)
            if guided:
                unconditional.finish_block(decoding.canvas, lo, hi)
