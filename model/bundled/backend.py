"""The bundled block-diffusion model as the chat engine's back end: every answer, in every decoding mode, is a step
object (model/decoding/) driven by the network's one `BatchRunner`, whose `SlotCache` is the network's only KV cache.
The runner is made once and kept, so a conversation's next prompt encodes only what it adds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from model.bundled.block_diffusion import BlockDiffusionLM
from model.chat.backend import AnswerPlan
from model.decoding.block_passes import BlockPasses, DiffusionSequence
from model.decoding.draft_policy import PRIOR_ACCEPTANCE, DraftPolicy
from model.decoding.end_of_turn import EndOfTurnProbe
from model.decoding.refinement import Refinement
from model.decoding.sampler import DiffusionDecoding, SamplerConfig, validate_request
from model.decoding.speculative import SpeculativeDecoding
from model.decoding.step import DecodingSequence, FoldingSequence
from model.drafting.context import DraftingContext
from model.drafting.drafter import Drafter, TargetShape, load_drafter
from model.drafting.native import NativeDrafter
from model.errors import ModelError
from model.runtime.batch_runner import DEFAULT_MAX_BATCH, BatchRunner, Run
from model.runtime.batching import TapsRows, rows_pass_of


class _RunPasses:
    """A runner's `Run` as an answer's passes: one iterator, closed (the slot freed) when the caller stops."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self._passes: Generator[Refinement, None, None] = self._iterate()

    def _iterate(self) -> Generator[Refinement, None, None]:
        yield from self._run

    @property
    def reused_tokens(self) -> int:
        return self._run.reused_tokens

    def __iter__(self) -> Iterator[Refinement]:
        return self._passes

    def close(self) -> None:
        self._passes.close()


class BlockDiffusionBackend:
    """A `BlockDiffusionLM` behind the `Backend` contract (model/chat/backend.py), answers batched by its runner."""

    def __init__(self, model: BlockDiffusionLM, eos_ids: Iterable[int], max_batch: int | None = None) -> None:
        if max_batch is not None and max_batch < 1:
            raise ModelError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.mask_id = model.mask_id
        # The mask id sits just past the tokenizer's vocabulary; logits get one extra column for it, always -inf.
        self.vocab_size = model.vocab_size + 1
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.runner = BatchRunner(model, max_batch or DEFAULT_MAX_BATCH)
        # One policy per mask count: what it learns about pass costs and acceptance holds for every answer
        self._draft_policies: dict[int, DraftPolicy] = {}
        self._policies_lock = threading.Lock()
        # A drafter on the network's own hidden rows (model/drafting/): when set, self-speculative answers draft with
        # it instead of mask rows (`use_drafter`)
        self.drafter: Drafter | None = None
        self._drafter_policy: DraftPolicy | None = None
        self._native_drafter: NativeDrafter | None = None
        self.drafter_acceptance: tuple[float, ...] = ()

    @property
    def dtype(self) -> torch.dtype:
        return self.model.base.dtype

    @property
    def max_batch(self) -> int:
        return self.runner.max_batch

    constrains = True  # every step object masks with the plan's grammar (speculative.py, sampler.py)

    def check(self, config: SamplerConfig) -> None:
        # classifier-free guidance needs a second state over the same weights; the runner keeps one state per answer,
        # and guidance is a masked sampler's tool
        if config.cfg_scale > 0:
            raise ModelError("the block-diffusion model does not support classifier-free guidance (cfg_scale): set it "
                             "to 0")

    def use_drafter(self, drafter: Drafter | None, prior: Sequence[float] = ()) -> None:
        """Draft with `drafter` (None: with the adapter's mask rows again); `prior`: its measured acceptance by draft
        position (cumulative, as drafter.json holds it), the draft policy's starting point."""
        if drafter is not None:
            drafter.check_target(TargetShape.of(self.model.base.config))
            if not self.taps_rows():
                raise ModelError("a drafter reads the network's hidden rows through the decode kernel, which does "
                                 "not run this model here (no int4 weights, or not a CPU)")
        self.drafter = drafter
        self.drafter_acceptance = tuple(prior)  # measured by its training, cumulative by draft position
        self._native_drafter = None if drafter is None else NativeDrafter(drafter)  # taps mean the kernels run
        conditional = tuple(b / a if a > 0 else 0.0 for a, b in zip((1.0, *prior), prior, strict=False))
        self._drafter_policy = None if drafter is None else DraftPolicy(
            drafter.config.block, prior=tuple(min(0.95, max(0.05, p)) for p in conditional) or PRIOR_ACCEPTANCE)

    def taps_rows(self) -> bool:
        """Whether the passes can hand a drafter the network's hidden rows (the decode kernel runs them)."""
        fast = rows_pass_of(self.model)
        return fast is not None and isinstance(fast, TapsRows)

    def load_drafter(self, directory: Path, head_rows: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """`use_drafter` with the drafter saved in `directory` (model/drafting/drafter.py), its head rows read from
        this network's head (or by `head_rows(ids)`, for a network whose head is not held densely), its measured
        acceptance as the policy's prior."""
        head = self.model.base.get_output_embeddings().weight.detach()

        def dense_rows(ids: torch.Tensor) -> torch.Tensor:
            return head[ids].float()

        drafter = load_drafter(directory, TargetShape.of(self.model.base.config), head_rows or dense_rows)
        meta = json.loads((directory / "drafter.json").read_text())
        self.use_drafter(drafter, meta.get("acceptance", {}).get("after", ()))

    def embedded(self, ids: torch.Tensor) -> torch.Tensor:
        """The network's token embeddings of `ids` `[n]` -> `[n, hidden]` fp32 (a drafted block's first row)."""
        return self.model.base.get_input_embeddings()(ids).float()

    def answer(self, plan: AnswerPlan, cancel: threading.Event | None) -> _RunPasses:
        options = plan.options
        run = self.runner.submit(self.sequence(plan), options.interactive, cancel, options.conversation,
                                 lead=options.draft_lead if options.interactive else 0)
        return _RunPasses(run)

    def prepare(self, tokens: list[int], cancel: threading.Event | None, conversation: str | None) -> bool:
        self.runner.prepare(tokens, cancel, conversation)
        return True

    def standing_aside(self, seconds: float) -> AbstractContextManager[None]:
        return self.runner.standing_aside(seconds)

    def sequence(self, plan: AnswerPlan) -> DecodingSequence:
        """This answer's decoding as a step object for the runner. Without the cache (`use_cache` False, for
        comparisons) diffusion passes re-encode the prompt every time; the other modes refuse."""
        config, options = plan.config, plan.options
        sequence: FoldingSequence
        if config.decoding == "diffusion":
            validate_request(self, plan.prompt, plan.length, config)
            decoding = DiffusionDecoding(self.mask_id, self.eos_ids, plan.length, config, options, plan.guard,
                                         plan.grammar)
            passes = BlockPasses(plan.prompt, self.model.vocab_size, cached=config.use_cache)
            sequence = DiffusionSequence(decoding, passes)
        elif not config.use_cache:
            raise ModelError(f"{config.decoding} decoding needs the KV cache (drop --no-cache)")
        else:
            masks = config.draft_masks if config.decoding == "self-speculative" else 0
            drafting = None
            policy = self.draft_policy(config)
            if masks and self.drafter is not None:
                drafting = DraftingContext(self.drafter, self.embedded, len(plan.prompt) - 1, self._native_drafter)
                masks = self.drafter.config.block
            sequence = SpeculativeDecoding(
                plan.prompt, plan.length, masks, self.mask_id, self.eos_ids, options.temperature, options.seed,
                plan.guard, config.draft_branches, policy, plan.grammar, options.draft_lead, drafting,
            )
        if plan.probe is None:
            return sequence
        return EndOfTurnProbe(sequence, plan.prompt, plan.probe.row, plan.probe.end_ids)

    def draft_policy(self, config: SamplerConfig) -> DraftPolicy | None:
        """The shared draft policy for `config` (one per mask count), or None when the layout is fixed."""
        if config.decoding != "self-speculative" or config.draft_layout != "adaptive":
            return None
        if self._drafter_policy is not None:  # the drafter's, whatever the masks
            return self._drafter_policy
        with self._policies_lock:
            return self._draft_policies.setdefault(config.draft_masks, DraftPolicy(config.draft_masks))
