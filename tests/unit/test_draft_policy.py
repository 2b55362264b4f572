"""The draft policy (model/decoding/draft_policy.py): which layout a lone self-speculative pass uses, from what passes
cost and how often drafts are accepted; answers stay the teacher's whatever it chooses."""

from __future__ import annotations

import pytest

from model.bundled.backend import BlockDiffusionBackend
from model.bundled.draft_calibration import calibrate_drafts
from model.chat.engine import DiffusionChatModel
from model.decoding.draft_policy import (
    CALIBRATION_ROUNDS,
    CALIBRATION_RUN,
    RETIME_EVERY,
    RETIME_EVERY_MAX,
    DraftPolicy,
)
from model.decoding.sampler import SamplerConfig
from model.decoding.speculative import SpeculativeDecoding
from model.runtime.batch_runner import BatchRunner
from scripts.report_lib.tiny_models import tiny_llama, word_tokenizer
from tests.unit.drive import decode, speculative
from tests.unit.test_self_speculative import (  # noqa: F401  (one_thread: autouse)
    EOS,
    OracleDrafts,
    adapted,
    final_tokens,
    one_thread,
    prompts,
    teacher_greedy,
)


class Decoder:
    """Drives a policy as a lone answer's steps would: a pass drafts what the last pass's masks guessed, so the first
    pass after a switch to more masks verifies fewer drafts than it has masks and is not timed (not steady)."""

    def __init__(self, policy: DraftPolicy) -> None:
        self.policy, self.drafts = policy, 0

    def run(self, cost_ms: dict[int, float], accepted_of: dict[int, int], passes: int, load: float = 1.0) -> list[int]:
        """`passes` steps of layouts costing `cost_ms` times `load`; returns the layouts chosen."""
        chosen = []
        for _ in range(passes):
            masks = self.policy.choose()
            chosen.append(masks)
            drafted = min(masks, self.drafts)
            steady = drafted == masks
            self.policy.observe(masks, drafted, min(accepted_of.get(masks, 0), drafted),
                                cost_ms[masks] * load if steady else None)
            self.drafts = masks
        return chosen


def settle(policy: DraftPolicy, cost_ms: dict[int, float], accepted_of: dict[int, int], passes: int) -> list[int]:
    return Decoder(policy).run(cost_ms, accepted_of, passes)


def test_every_layout_is_timed_in_turn_before_it_is_judged() -> None:
    policy = DraftPolicy(max_masks=3)
    decoder = Decoder(policy)
    first = decoder.run({0: 25, 1: 27, 2: 30, 3: 46}, {}, 2 * 4 * CALIBRATION_RUN)
    assert first == [m for m in (0, 1, 2, 3) for _ in range(CALIBRATION_RUN)] * 2
    assert all(cost is not None for cost in policy.costs())
    assert policy.costs() == pytest.approx([25, 27, 30, 46])


def test_drafts_that_do_not_pay_for_their_mask_rows_give_autoregressive_passes() -> None:
    # the AMD machine's shape: a drafting pass costs 1.8x a lone row, and drafts are rarely right
    policy = DraftPolicy(max_masks=3)
    choices = settle(policy, {0: 25.6, 1: 33.0, 2: 39.0, 3: 46.4}, {1: 0, 2: 0, 3: 0}, 200)
    assert choices[-50:].count(0) >= 45


def test_a_few_passes_slowed_by_other_load_do_not_hand_the_choice_to_a_dearer_layout() -> None:
    # int4 weights on a shared machine: a lone row 32 ms, one draft a pass 66 ms; two passes of the cheap layout
    # caught beside another process's work took 73 and 70 ms (measured), which a running mean turned into a switch
    policy = DraftPolicy(max_masks=1)
    decoder = Decoder(policy)
    decoder.run({0: 32, 1: 66}, {1: 1}, 40)
    for spike in (73.0, 70.0):
        masks = policy.choose()
        assert masks == 0
        policy.observe(0, 0, 0, spike)
    assert decoder.run({0: 32, 1: 66}, {1: 1}, 20).count(0) >= 20 - CALIBRATION_RUN  # a re-timing run at most


@pytest.mark.parametrize(("cost", "accepted_of", "best"), [
    # drafts right half the time on the AVX2 EPYC: one draft a pass just short of the margin, so autoregressive
    ({0: 10.0, 1: 13.0}, {1: 0}, 0),
    # good drafts on flat pass costs (AMX): drafting
    ({0: 55.0, 1: 57.0}, {1: 1}, 1),
])
def test_a_load_that_slows_every_layout_alike_does_not_change_the_choice(cost, accepted_of, best) -> None:
    # The costs an earlier process calibrated, then the machine gets busy (another process on the 2 cores): every step
    # costs 1.6x. Only the layout in use is timed, so costs compared as milliseconds would set its live cost against
    # the others' calibrated ones and switch to a layout that is just as much dearer under the load.
    policy = DraftPolicy(max_masks=1)
    policy.seed([cost[0], cost[1]])
    for _ in range(40):  # what the drafts' acceptance is, known from batched passes
        policy.observe(1, 1, accepted_of[1], None)
    decoder = Decoder(policy)
    assert decoder.run(cost, accepted_of, 20) == [best] * 20
    assert decoder.run(cost, accepted_of, RETIME_EVERY - 21, load=1.6) == [best] * (RETIME_EVERY - 21)
    assert policy.costs()[best] == pytest.approx(1.6 * cost[best])
    assert policy.costs()[1 - best] == pytest.approx(1.6 * cost[1 - best])  # the other one priced at the same load


def test_good_drafts_on_flat_pass_costs_draft_the_most() -> None:
    # the Intel AMX machine's shape: a 16-row pass costs about 1.3x a lone row; drafts right 90 % of the time
    policy = DraftPolicy(max_masks=3)
    cost = {0: 55.0, 1: 57.0, 2: 63.0, 3: 72.0}
    choices = settle(policy, cost, {1: 1, 2: 2, 3: 3}, 200)
    assert choices[-50:].count(3) >= 45
    assert policy.acceptance()[0] > 0.9
    assert policy.expected_tokens(3) > 3.5


def test_a_layout_is_timed_again_as_the_machine_changes() -> None:
    # autoregressive passes are best (one draft a pass, always right, promises +18 %: under the margin), so the
    # drafting layout is timed only in re-timing runs: its first pass has no drafts yet, the next ones are timed
    policy = DraftPolicy(max_masks=2)
    decoder = Decoder(policy)
    assert decoder.run({0: 20, 1: 34, 2: 60}, {1: 1}, RETIME_EVERY * 3)[-20:] == [0] * 20
    assert policy.layouts[1].timed_at > RETIME_EVERY
    # then drafting gets cheap on this machine: a re-timing, however rare by now, finds it
    assert decoder.run({0: 20, 1: 22, 2: 60}, {1: 1}, 2 * RETIME_EVERY_MAX)[-50:] == [1] * 50


def test_a_layout_far_dearer_than_the_best_is_rarely_timed_again() -> None:
    # int4 kernels: a lone row 10 ms, four drafts a pass 36 ms, drafts rarely right
    policy = DraftPolicy(max_masks=3)
    decoder = Decoder(policy)
    decoder.run({0: 10, 1: 17, 2: 26, 3: 36}, {}, 100)
    choices = decoder.run({0: 10, 1: 17, 2: 26, 3: 36}, {}, 4 * RETIME_EVERY_MAX)
    # while the choice stands, each re-timing waits twice as long as the last (up to RETIME_EVERY_MAX): a handful of
    # runs off the best layout in 8,192 choices, where a fixed cadence (every 64 and 512 choices) ran 32 or more
    assert len(choices) - choices.count(0) <= 8 * CALIBRATION_RUN
    assert max(policy.layouts[2].timed_at, policy.layouts[3].timed_at) > 100  # yet the dearest are timed again


def test_acceptance_counts_each_position_only_when_the_drafts_before_it_were_accepted() -> None:
    policy = DraftPolicy(max_masks=3)
    tried, accepted = list(policy.tried), list(policy.accepted)
    policy.observe(3, drafted=3, accepted=1, pass_ms=None)  # draft 1 accepted, draft 2 rejected, draft 3 unseen
    assert [t - t0 for t, t0 in zip(policy.tried, tried, strict=True)] == [1, 1, 0]
    assert [a - a0 for a, a0 in zip(policy.accepted, accepted, strict=True)] == [1, 0, 0]
    assert all(layout.timings == 0 for layout in policy.layouts)  # no timing: nothing learnt about cost
    assert policy.costs() == [None] * 4


def test_adaptive_layouts_still_give_the_teachers_answer() -> None:
    model = adapted()
    teacher = tiny_llama()
    runner = BatchRunner(model, max_batch=1)
    policy = DraftPolicy(max_masks=4)
    layouts = set()
    for index, prompt in enumerate(prompts(10)):
        reference = teacher_greedy(teacher, prompt, 20)
        expected = reference[: reference.index(EOS) + 1] if EOS in reference else reference
        oracle = OracleDrafts(speculative(model, prompt, 20, masks=4, policy=policy), reference, error_rate=0.3,
                              seed=index)
        before = policy.choices
        refinements = decode(runner, oracle)
        assert final_tokens(refinements) == expected, index
        layouts.update(m for m, layout in enumerate(policy.layouts) if layout.timed_at > before)
    runner.close()
    assert len(layouts) >= 3  # the answers really ran under different layouts


def test_drafts_that_promise_less_than_the_margin_give_autoregressive_passes() -> None:
    # every draft right, but a drafting pass costs 1.9x a lone one: 2 tokens for 19 ms against 1 for 10 (+5 %),
    # less than two timings minutes apart differ on a shared machine
    policy = DraftPolicy(max_masks=1)
    for _ in range(200):  # drafts known to be right: batched passes that verified them
        policy.observe(1, 1, 1, None)
    choices = settle(policy, {0: 10, 1: 19}, {1: 1}, 200)
    assert policy.expected_tokens(1) / 19 > 1 / 10
    assert choices[-64:].count(0) >= 64 - CALIBRATION_RUN  # a re-timing run of layout 1 aside


def test_calibration_times_every_layout_in_turn_and_a_seeded_policy_starts_from_its_costs() -> None:
    cost = {0: 15.0, 1: 41.0, 2: 63.0}  # a 2-core AVX2 EPYC: drafting passes 2.7-4x a lone step
    policy = DraftPolicy(max_masks=2)
    policy.calibrate()
    schedule = settle(policy, cost, {1: 1, 2: 1}, CALIBRATION_ROUNDS * 3 * CALIBRATION_RUN)
    assert schedule[: 3 * CALIBRATION_RUN] == [m for m in (0, 1, 2) for _ in range(CALIBRATION_RUN)]  # interleaved
    assert not policy.calibrating and policy.costs() == pytest.approx([15.0, 41.0, 63.0])
    assert settle(policy, cost, {1: 1, 2: 1}, 20) == [0] * 20

    fresh, seeded = DraftPolicy(max_masks=2), DraftPolicy(max_masks=2)
    seeded.seed([15.0, 41.0, 63.0])
    assert settle(seeded, cost, {}, 20) == [0] * 20  # no pass drafts to learn what the calibration knew
    assert settle(fresh, cost, {}, 20).count(0) < 20  # unseeded, it first times the drafting layouts


def test_calibration_at_load_is_measured_once_per_machine_and_seeds_the_next_process(tmp_path) -> None:
    def chat_model() -> DiffusionChatModel:
        tokenizer = word_tokenizer()
        config = SamplerConfig(block_length=4, steps_per_block=4, decoding="self-speculative", draft_masks=2,
                               draft_layout="adaptive")
        return DiffusionChatModel("tiny", tokenizer, BlockDiffusionBackend(adapted(), [tokenizer.eos_token_id]),
                                  config)

    def with_backend(chat: DiffusionChatModel) -> tuple[DiffusionChatModel, BlockDiffusionBackend]:
        assert isinstance(chat.backend, BlockDiffusionBackend)
        return chat, chat.backend

    store, prompts = tmp_path / "draft_costs.json", ("hello how are you", "what is your name", "the cat")
    first = chat_model()
    costs = calibrate_drafts(first, first.backend, store, "this machine", prompts)
    assert costs is not None and len(costs) == 3 and all(cost > 0 for cost in costs)
    assert first.backend.draft_policy(first.sampler).choices >= 3 * 5 * 3  # it ran the whole schedule
    second = chat_model()
    assert calibrate_drafts(second, second.backend, store, "this machine", prompts) == costs
    policy = second.backend.draft_policy(second.sampler)
    assert policy.choices == 0 and policy.costs() == costs  # read, not measured again
    other = chat_model()
    calibrate_drafts(other, other.backend, store, "another machine", prompts)
    assert other.backend.draft_policy(other.sampler).choices > 0  # another key: measured
    store.write_text("not json")
    # a broken file: measured again
    assert calibrate_drafts(*with_backend(chat_model()), store, "this machine", prompts) is not None


def test_with_the_adaptive_policy_a_batched_pass_drafts_nothing_and_a_fixed_layout_keeps_its_masks() -> None:
    """On a CPU a pass of several answers is bound by its rows' integer work: another answer's clean row yields a
    token where a draft and its mask yield half of one, so the adaptive policy decodes a crowd autoregressively
    (drafts it made alone are dropped, not verified); a fixed layout is the caller's choice and keeps its masks."""
    from model.decoding.speculative import SpeculativeDecoding

    def sequence(policy: DraftPolicy | None) -> SpeculativeDecoding:
        return SpeculativeDecoding([5, 6, 7], 16, 3, mask_id=2, eos_ids=(1,), policy=policy)

    adaptive, fixed = sequence(DraftPolicy(3)), sequence(None)
    adaptive.drafts = [8, 9]
    crowded = adaptive.feed(crowd=4)
    assert crowded.noisy == () and crowded.clean == (7,)
    assert len(fixed.feed(crowd=4).noisy) == 3 and fixed.feed(crowd=4).drafts
    assert adaptive.feed(crowd=1).drafts  # alone, it drafts as the policy chooses (its noisy rows are drafts)


def test_the_answers_lead_is_drafted_whatever_the_policy_says_and_the_answer_stays_the_teachers() -> None:
    """A voice answer's first phrase is spoken from its drafts: its first `draft_lead` tokens are drafted in one block
    after the drafts, alone or batched, even where the policy has judged that drafts do not pay; then the policy's
    choice (here autoregressive passes) rules again. The answer is the teacher's either way."""
    model = adapted()
    teacher = tiny_llama()
    runner = BatchRunner(model, max_batch=1)
    prompt = prompts(1)[0]
    reference = teacher_greedy(teacher, prompt, 20)
    expected = reference[: reference.index(EOS) + 1] if EOS in reference else reference

    class NeverDrafts(DraftPolicy):  # judged, for good: drafts do not pay for tokens per ms, yet rows are cheap
        def choose(self) -> int:
            return 0

        def lead_pays(self) -> bool:
            return True

    def judged() -> DraftPolicy:
        return NeverDrafts(max_masks=3)

    sequence = speculative(model, prompt, 20, masks=3, policy=judged())
    sequence.draft_lead = 6
    fed: list[tuple[int, int, int]] = []  # (answer tokens before the pass, mask rows, clean rows)
    feed = sequence.feed

    def watched(crowd: int = 1):
        step = feed(crowd)
        fed.append((len(sequence.answer), len(step.noisy), len(step.clean)))
        return step

    sequence.feed = watched  # type: ignore[method-assign]
    oracle = OracleDrafts(sequence, reference, error_rate=0.3, seed=1)
    assert final_tokens(decode(runner, oracle)) == expected
    runner.close()
    assert all(masks == 3 for done, masks, _ in fed if done < 6)  # one block of masks, never a block per draft
    assert all(masks == 0 for done, masks, _ in fed if done >= 6) and fed[-1][0] >= 6

    crowded = SpeculativeDecoding([5, 6, 7], 16, 3, mask_id=2, eos_ids=(1,), policy=judged(), draft_lead=4)
    assert len(crowded.feed(crowd=4).noisy) == 3  # batched with other answers, the lead is drafted too


def test_the_lead_is_drafted_only_where_one_draft_a_pass_has_been_judged_nearly_free() -> None:
    """On a CPU where a draft row costs most of a lone step, drafting the first phrase made it commit later than the
    speech it rendered early saved (LEAD_MAX_SHAPE); where rows share a weight read it pays."""
    assert not DraftPolicy(max_masks=3).lead_pays()  # nothing judged yet
    dear, cheap = DraftPolicy(max_masks=3), DraftPolicy(max_masks=3)
    dear.seed([10.0, 17.0, 25.0, 48.0])  # the 2-core AVX2 EPYC's int4 kernels
    cheap.seed([20.0, 20.4, 21.0, 22.0])  # a GPU pass: launch-bound, rows nearly free
    assert not dear.lead_pays() and cheap.lead_pays()
    lead = SpeculativeDecoding([5, 6, 7], 16, 3, mask_id=2, eos_ids=(1,), policy=dear, draft_lead=6)
    assert lead.feed(crowd=4).noisy == ()  # batched, the policy's rule: no drafts


def test_a_pass_the_runner_marks_untimed_is_not_timed_for_the_policy() -> None:
    """A lead's pass on a wider team of threads (model/runtime/batch_runner.py `_team`) says nothing about what a
    layout costs on the usual team: `untimed()` after `feed` keeps its step out of the policy's costs, not out of
    its acceptance counts."""
    import torch

    observed: list[float | None] = []

    class Recording(DraftPolicy):
        def observe(self, masks: int, drafted: int, accepted: int, pass_ms: float | None) -> None:
            observed.append(pass_ms)
            super().observe(masks, drafted, accepted, pass_ms)

    decoding = SpeculativeDecoding([5, 6, 7], 16, 3, mask_id=2, eos_ids=(1,), policy=Recording(3))
    decoding.policy.seed([10.0, 30.0, 40.0, 50.0])  # drafting judged dear: lone autoregressive passes
    logits = torch.zeros(1, 12)
    for untimed in (False, False, True, False):
        decoding.feed()
        if untimed:
            decoding.untimed()
        logits[0] = 0.0
        logits[0, 9] = 1.0  # never an end token
        decoding.consume(logits, torch.zeros(0, 12), 0.01)
    assert observed[0] is None and observed[1] is not None  # the first step has no start; the second is timed
    assert observed[2] is None and observed[3] is not None
