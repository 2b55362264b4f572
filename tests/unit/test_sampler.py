"""The sampler's commit policy, pinned with a scripted test double of the `Denoiser` protocol (no network)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from model.decoding.options import GenerationOptions
from model.decoding.sampler import SamplerConfig, commit_schedule, generate, sample_tokens
from model.errors import ModelError

VOCAB = 12
MASK = 11
EOS = 10


class ScriptedDenoiser:
    """Predicts a fixed answer `plan`; position i's logit for its planned token is `strength[i]` (others 0).

    Records every call so tests can see which blocks ran and what the canvas held.
    """

    block_causal = True

    def __init__(self, plan: list[int], strength: list[float] | None = None, mask_id: int | None = MASK) -> None:
        self.plan = plan
        self.strength = strength or [3.0 + 0.1 * i for i in range(len(plan))]
        self.mask_id = mask_id
        self.eos_ids = frozenset({EOS})
        self.vocab_size = VOCAB
        self.calls: list[tuple[int, int]] = []
        self.finished: list[tuple[int, int]] = []
        self.started: list[list[int]] = []

    def start(self, prompt_ids: list[int], max_new_tokens: int, use_cache: bool) -> None:
        self.started.append(list(prompt_ids))

    def block_logits(self, canvas: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        self.calls.append((lo, hi))
        logits = torch.zeros(hi - lo, VOCAB)
        for j in range(hi - lo):
            logits[j, self.plan[lo + j]] = self.strength[lo + j]
        logits[:, MASK] = -torch.inf
        return logits

    def finish_block(self, canvas: torch.Tensor, lo: int, hi: int) -> None:
        self.finished.append((lo, hi))


def run(denoiser, config: SamplerConfig, max_new_tokens: int, cancel=None, **kwargs):
    return list(generate(denoiser, [1, 2, 3], max_new_tokens, config, cancel, **kwargs))


def newly_committed(refinements) -> list[int]:
    counts, before = [], 0
    for refinement in refinements:
        counts.append(sum(refinement.committed) - before)
        before = sum(refinement.committed)
    return counts


def test_commit_schedule_is_the_even_linear_split() -> None:
    assert commit_schedule(32, 8) == [4] * 8
    assert commit_schedule(10, 4) == [3, 3, 2, 2]
    assert commit_schedule(4, 4) == [1, 1, 1, 1]


def test_each_pass_commits_its_budget_and_blocks_run_in_order() -> None:
    denoiser = ScriptedDenoiser(plan=[1 + i % 9 for i in range(16)])
    refinements = run(denoiser, SamplerConfig(block_length=8, steps_per_block=3), 16)
    assert newly_committed(refinements) == [3, 3, 2, 3, 3, 2]
    assert denoiser.calls == [(0, 8)] * 3 + [(8, 16)] * 3
    assert denoiser.finished == [(0, 8)]  # the last block ends the answer; nothing to fold into the cache after it
    last = refinements[-1]
    assert last.done and last.finish_reason == "length"
    assert list(last.tokens) == denoiser.plan
    assert [r.step for r in refinements] == list(range(6)) and [r.block for r in refinements] == [0] * 3 + [1] * 3


def test_low_confidence_commits_most_confident_first() -> None:
    strength = [1.0, 5.0, 2.0, 4.0]
    denoiser = ScriptedDenoiser(plan=[1, 2, 3, 4], strength=strength)
    first = run(denoiser, SamplerConfig(block_length=4, steps_per_block=2), 4)[0]
    assert first.committed == (False, True, False, True)


def test_left_to_right_commits_the_leftmost_then_anything_above_the_threshold() -> None:
    strength = [1.0, 5.0, 2.0, 4.0]
    denoiser = ScriptedDenoiser(plan=[1, 2, 3, 4], strength=strength)
    passes = run(denoiser, SamplerConfig(block_length=4, steps_per_block=2, remasking="left_to_right"), 4)
    assert [r.committed for r in passes] == [(True, True, False, False), (True, True, True, True)]
    denoiser = ScriptedDenoiser(plan=[1, 2, 3, 4], strength=strength)
    config = SamplerConfig(block_length=4, steps_per_block=4, remasking="left_to_right", threshold=0.9)
    first = run(denoiser, config, 4)[0]
    # probability of the planned token, logit s against 10 zeros (the mask is -inf): e^s / (e^s + 10)
    expected = [math.exp(s) / (math.exp(s) + 10) for s in strength]  # 0.21, 0.94, 0.42, 0.85
    assert first.confidence == pytest.approx(expected, abs=1e-6)
    # the leftmost is the pass's budget of one; 0.94 > 0.9 continues the run; 0.42 ends it (0.85 is right of it)
    assert first.committed == (True, True, False, False)


def test_left_to_right_never_commits_a_confident_position_right_of_a_masked_one() -> None:
    # position 1 is unsure, position 2 is sure: committing 2 first is how parallel decoding stutters
    denoiser = ScriptedDenoiser(plan=[1, 2, 3, 4], strength=[9.0, 0.1, 9.0, 9.0])
    config = SamplerConfig(block_length=4, steps_per_block=4, remasking="left_to_right", threshold=0.5)
    first = run(denoiser, config, 4)[0]
    assert first.confidence[2] > 0.5 > first.confidence[1]
    assert first.committed == (True, False, False, False)


def test_committed_tokens_never_change_and_mask_is_never_shown() -> None:
    generator = torch.Generator().manual_seed(0)
    plan = torch.randint(0, 10, (24,), generator=generator).tolist()
    denoiser = ScriptedDenoiser(plan=plan, strength=[0.5] * 24)  # weak logits: sampling wanders
    config = SamplerConfig(block_length=8, steps_per_block=8, remasking="random")
    frozen: dict[int, int] = {}
    refinements = run(denoiser, config, 24, options=GenerationOptions(temperature=1.5, seed=3))
    for refinement in refinements:
        assert MASK not in refinement.tokens
        for index, (token, is_committed) in enumerate(zip(refinement.tokens, refinement.committed, strict=True)):
            if index in frozen:
                assert is_committed and token == frozen[index]
            elif is_committed:
                frozen[index] = token
    assert len(frozen) == sum(refinements[-1].committed) >= 8  # sampling may commit an EOS early and stop


def test_eos_stops_generation_and_no_later_block_runs() -> None:
    plan = [1, 2, 3, 4, 5, EOS, 6, 7] + [8] * 8
    strength = [9.0 - i for i in range(16)]  # left to right, so the EOS has everything before it committed
    denoiser = ScriptedDenoiser(plan=plan, strength=strength)
    refinements = run(denoiser, SamplerConfig(block_length=4, steps_per_block=4), 16)
    last = refinements[-1]
    assert last.done and last.finish_reason == "stop"
    assert max(hi for _, hi in denoiser.calls) == 8  # blocks [8, 12) and [12, 16) never ran
    assert last.answer_length == 5
    assert last.tokens[5:] == (EOS, EOS, EOS) and all(last.committed)  # LLaDA convention: EOS fills the block
    assert len(refinements) == 4 + 2  # block 1 stops on the pass that committed the EOS (its second)


def test_committed_eos_waits_for_the_positions_before_it() -> None:
    plan = [1, 2, EOS, 3]
    strength = [1.0, 2.0, 9.0, 0.5]  # the EOS is committed first, position 0 last
    refinements = run(ScriptedDenoiser(plan=plan, strength=strength), SamplerConfig(4, 4), 4)
    assert [r.done for r in refinements] == [False, False, True]
    assert refinements[0].committed == (False, False, True, True)  # EOS committed, tail filled
    assert refinements[-1].finish_reason == "stop"


def test_cancel_stops_within_one_pass() -> None:
    cancel = threading.Event()
    stream = generate(ScriptedDenoiser(plan=[1] * 32), [1, 2], 32, SamplerConfig(8, 8), cancel)
    first = next(stream)
    assert not first.done
    cancel.set()
    rest = list(stream)
    assert len(rest) == 1 and rest[0].done and rest[0].finish_reason == "cancelled"


def test_same_seed_same_output() -> None:
    plan = list(range(10)) * 2
    config = SamplerConfig(block_length=10, steps_per_block=5, remasking="random")
    weak = [0.3] * 20
    seeded = GenerationOptions(temperature=2.0, seed=7)
    first = run(ScriptedDenoiser(plan, weak), config, 20, options=seeded)[-1].tokens
    again = run(ScriptedDenoiser(plan, weak), config, 20, options=seeded)[-1].tokens
    other_seed = GenerationOptions(temperature=2.0, seed=8)
    other = run(ScriptedDenoiser(plan, weak), config, 20, options=other_seed)[-1].tokens
    assert first == again
    assert first != other


def test_threshold_commits_every_confident_position_and_at_least_one() -> None:
    # softmax prob of the planned token with logit s against 11 zeros (mask is -inf): e^s / (e^s + 10)
    strength = [6.0, 6.0, 6.0, 0.0, 0.1, 0.2, 0.3, 0.4]  # ~0.98 for the first three, ~0.1 for the rest
    denoiser = ScriptedDenoiser(plan=[1, 2, 3, 4, 5, 6, 7, 8], strength=strength)
    refinements = run(denoiser, SamplerConfig(block_length=8, steps_per_block=8, threshold=0.9), 8)
    assert newly_committed(refinements) == [3, 1, 1, 1, 1, 1]
    few_steps = run(ScriptedDenoiser([1, 2, 3, 4, 5, 6, 7, 8], strength), SamplerConfig(8, 2, threshold=0.9), 8)
    assert newly_committed(few_steps) == [4, 4]  # the budget's floor bounds the passes per block


def test_classifier_free_guidance_combines_conditional_and_unconditional() -> None:
    conditional = ScriptedDenoiser(plan=[1, 1], strength=[2.0, 2.0])
    unconditional = ScriptedDenoiser(plan=[1, 1], strength=[3.0, 3.0])

    def logits_with_runner_up(self, canvas, lo, hi):  # token 2 at 1.9 in the conditional model only
        logits = ScriptedDenoiser.block_logits(self, canvas, lo, hi)
        logits[:, 2] = 1.9
        return logits

    conditional.block_logits = logits_with_runner_up.__get__(conditional)
    plain = run(conditional, SamplerConfig(2, 2), 2)[-1].tokens
    guided = run(conditional, SamplerConfig(2, 2, cfg_scale=1.0), 2, unconditional=unconditional)[-1].tokens
    assert plain == (1, 1)
    assert guided == (2, 2)  # 0 + 2 * 1.9 beats 3 + 2 * (2 - 3)
    assert unconditional.started == [[MASK, MASK, MASK]]


@pytest.mark.parametrize(
    ("prompt", "max_new_tokens", "config_args", "denoiser_args", "message"),
    [
        ([], 8, {}, {}, "prompt is empty"),
        ([1], 10, {"block_length": 4, "steps_per_block": 4}, {}, "whole number of blocks"),
        ([1], 0, {}, {}, "at least 1"),
        ([1], 8, {"block_length": 8, "steps_per_block": 8}, {"mask_id": None}, "no usable mask token"),
        ([99], 8, {"block_length": 8, "steps_per_block": 8}, {}, "outside the model's vocabulary"),
    ],
)
def test_bad_requests_raise_model_error(prompt, max_new_tokens, config_args, denoiser_args, message) -> None:
    config = SamplerConfig(**({"block_length": 8, "steps_per_block": 8} | config_args))
    with pytest.raises(ModelError, match=message):
        list(generate(ScriptedDenoiser([1] * 16, **denoiser_args), prompt, max_new_tokens, config))


@pytest.mark.parametrize(
    ("config_args", "message"),
    [
        ({"block_length": 0}, "block_length"),
        ({"block_length": 4, "steps_per_block": 5}, "steps_per_block"),
        ({"remasking": "best"}, "remasking"),
        ({"threshold": 1.5}, "threshold"),
    ],
)
def test_bad_configs_raise_model_error(config_args, message) -> None:
    with pytest.raises(ModelError, match=message):
        SamplerConfig(**config_args)


def test_guidance_without_unconditional_denoiser_is_refused() -> None:
    with pytest.raises(ModelError, match="unconditional"):
        run(ScriptedDenoiser([1] * 4), SamplerConfig(4, 4, cfg_scale=1.0), 4)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_gumbel_sampling_draws_tokens_with_softmax_of_logits_over_temperature(temperature: float) -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    samples = 40_000
    tokens = sample_tokens(logits.expand(samples, -1).clone(), temperature, torch.Generator().manual_seed(1234))
    observed = torch.bincount(tokens, minlength=5).double()
    expected = torch.softmax(logits.double() / temperature, dim=0) * samples
    chi_square = float(((observed - expected) ** 2 / expected).sum())
    # 18.47 is the chi-square value with 4 degrees of freedom that chance exceeds once in 1,000
    assert chi_square < 18.47, (observed.tolist(), expected.tolist())
    assert torch.equal(sample_tokens(logits[None], 0.0, torch.Generator()), torch.tensor([0]))  # T = 0: argmax


def test_a_negative_temperature_is_refused_when_the_answer_is_asked_for() -> None:
    with pytest.raises(ModelError, match="temperature must be >= 0"):
        GenerationOptions(temperature=-1.0).check()
    GenerationOptions(temperature=0.5).check()
