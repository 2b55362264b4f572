"""The settings of an adapter's training, without torch: a command line reads its defaults before anything heavy is
imported (`dlm adapt`, model/cli.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Recipe:
    """The training settings; the defaults are what the shipped adapter's last round used (its adapter.json)."""

    batch: int = 8
    copies: int = 2  # noisy copies per clean pass
    lr: float = 5e-4
    max_steps: int = 1000
    minutes: float = 90.0  # stop this run after this many minutes (a later run resumes)
    bf16: bool | None = None  # bf16 autocast; None: where the device multiplies bf16 natively (`use_bf16`)
    seed: int = 1234
    save_every: int = 50
    drafting: bool = True  # the one-shot drafting objective self-speculative decoding needs (make_batch)
    draft_masks: int = 3  # drafting: mask rows of a block (decoding feeds this many after a clean token)
    near_weight: float = 0.7  # drafting: loss weight ratio of each further draft
    eval_every: int = 50  # steps between measurements of the drafts' acceptance

    def block(self, block_length: int) -> int:
        """The positions of one training block: a drafting block is `draft_masks` masks after a clean token, else
        the adapter's `block_length`."""
        return self.draft_masks + 1 if self.drafting else block_length


@dataclass(frozen=True, slots=True)
class AdaptSettings:
    """What `dlm adapt` trains: how many answers, the adapter's shape, the recipe, and where."""

    examples: int = 1000  # training prompts the teacher answers
    heldout: int = 16  # held-out prompts the drafts' acceptance is measured on
    max_new_tokens: int = 64
    teacher_batch: int = 16
    block_length: int = 4
    rank: int = 16
    device: str = "cpu"
    recipe: Recipe = field(default_factory=Recipe)


@dataclass(frozen=True, slots=True)
class DrafterSettings:
    """What `dlm adapt --drafter` trains: the target's answers it learns from, the drafter's shape, its training."""

    examples: int = 1000  # training prompts the target answers
    heldout: int = 16  # held-out prompts the drafts' acceptance is measured on
    max_new_tokens: int = 64
    chunk: int = 16  # prompts the target answers together (one pass a step for all of them)
    block: int = 4  # tokens a drafting call proposes
    shortlist: int = 4096  # the tokens the drafter's head scores: those the answers use most
    steps: int = 1500
    batch: int = 16  # answers a training step
    lr: float = 1e-3
    minutes: float = 30.0  # stop this run's training after this many minutes (a later run resumes)
    save_every: int = 100
    eval_every: int = 250
