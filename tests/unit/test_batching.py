"""Batched passes (model/runtime/batching.py, model/runtime/batch_runner.py) on a tiny random block-diffusion Llama in
fp32: a
sequence's logits and answers in a batch equal its own, whatever else shares the pass."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from model.bundled.backend import BlockDiffusionBackend
from model.bundled.block_diffusion import BlockDiffusionLM
from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.decoding.options import PLAIN
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig
from model.errors import ModelError
from model.runtime.batch_runner import FOLD_LIMIT, BatchRunner, Run, admission
from model.runtime.batching import (
    GROWTH,
    KEEP_AFTER_ANSWER,
    Feed,
    PassRows,
    SlotCache,
    additive_mask,
    batched_pass,
    keep,
    pass_layout,
    prefill,
)
from scripts.report_lib.passes import PassLog, answer_refinements, stop_batching
from scripts.report_lib.tiny_models import LLAMA_EOS, LLAMA_VOCAB, byte_tokenizer
from tests.unit.drive import reference_logits as cache_free_logits
from tests.unit.drive import sequence
from tests.unit.test_self_speculative import adapted, one_thread  # noqa: F401  (autouse: tiny tensors, 1 thread)

EOS = LLAMA_EOS
# Pass by pass equal to the answer alone: one drafting block (an answer alone drafts a block after every draft, in a
# batch one block; see test_a_lone_answer_drafts_after_every_draft_and_a_batched_one_after_all).
MODES = {
    "self-speculative": SamplerConfig(block_length=4, steps_per_block=4, decoding="self-speculative", draft_masks=4,
                                      draft_branches=False),
    "autoregressive": SamplerConfig(block_length=4, steps_per_block=4, decoding="autoregressive"),
    "diffusion": SamplerConfig(block_length=4, steps_per_block=4, threshold=0.3, remasking="left_to_right"),
}


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, LLAMA_VOCAB) for _ in range(rng.randrange(1, 30))] for _ in range(count)]


def reference_logits(model: BlockDiffusionLM, context: list[int], feed: Feed) -> torch.Tensor:
    """Logits of `feed`'s rows after `context` from one cache-free forward over the whole sequence."""
    return cache_free_logits(model, context + list(feed.clean), feed.noisy)[len(context) :].float()


def rows_from_layout(slots: list[int], lengths: list[int], feeds: list[Feed], key_multiple: int) -> PassRows:
    """PassRows as its contract states it: `pass_layout`'s rows, positions and mask, gathered in the kernel's row
    order (each answer's clean rows, then the deciding noisy rows, then the drafting ones)."""
    ids, positions, _, allowed = pass_layout(lengths, feeds, key_multiple)
    s = ids.shape[1]
    order: list[tuple[int, int]] = []
    spans: list[list[slice]] = [[] for _ in feeds]
    bounds = []
    for section in ("clean", "decides", "drafts"):
        for i, feed in enumerate(feeds):
            if section == "clean":
                columns = range(len(feed.clean))
            elif (section == "drafts") == feed.drafts:
                columns = range(s - len(feed.noisy), s)
            else:
                continue
            spans[i].append(slice(len(order), len(order) + len(columns)))
            order += [(i, c) for c in columns]
        bounds.append(len(order))
    feed_of = torch.tensor([i for i, _ in order], dtype=torch.long)
    column = torch.tensor([c for _, c in order], dtype=torch.long)
    return PassRows(ids[feed_of, column], positions[feed_of, column], torch.tensor(slots)[feed_of],
                    torch.tensor(lengths)[feed_of] + column, additive_mask(allowed[feed_of, 0, column]), bounds[0],
                    bounds[1], tuple((clean, noisy) for clean, noisy in spans))


def test_a_passs_rows_are_the_layouts_rows_in_the_kernels_order() -> None:
    rng = random.Random(5)
    for _ in range(400):
        feeds = []
        for _ in range(rng.randint(1, 4)):
            c, n = rng.randint(1, 6), rng.choice([0, 1, 2, 3, 6])
            after = tuple(sorted(rng.randint(1, c) for _ in range(n))) if n and rng.random() < 0.5 else ()
            feeds.append(Feed(tuple(rng.randrange(900) for _ in range(c)), tuple(rng.randrange(900) for _ in range(n)),
                              after, drafts=rng.random() < 0.5))
        slots, lengths = rng.sample(range(8), len(feeds)), [rng.randint(0, 40) for _ in feeds]
        multiple = rng.choice([1, 32])
        built, expected = PassRows.of(slots, lengths, feeds, multiple), rows_from_layout(slots, lengths, feeds,
                                                                                          multiple)
        for name in ("ids", "positions", "slots", "writes", "bias"):
            assert torch.equal(getattr(built, name), getattr(expected, name)), (name, feeds, lengths)
        assert (built.start, built.coarse, built.answers) == (expected.start, expected.coarse, expected.answers)


def test_the_caches_buffer_pointers_follow_its_buffers() -> None:
    cache, like = SlotCache(2), torch.empty(1, 2, 0, 4, dtype=torch.bfloat16)
    first = cache.layer_buffers(3, 10, like)
    assert cache.layer_buffers(3, 10, like) is first  # kept while nothing changes
    assert tuple(first.keys) == tuple(cache.buffers(layer, 10, like)[0].data_ptr() for layer in range(3))
    assert tuple(first.capacity) == (GROWTH,) * 3
    grown = cache.layer_buffers(3, 4 * GROWTH, like)  # room for more positions: new buffers, new pointers
    assert tuple(grown.capacity) == (4 * GROWTH,) * 3
    assert tuple(grown.values) == tuple(cache.buffers(layer, 1, like)[1].data_ptr() for layer in range(3))
    cache.slots[0].ids.extend(range(5))
    cache.release(0)  # gives back the capacity no slot needs: the buffers are copies
    released = cache.layer_buffers(3, 10, like)
    assert tuple(released.capacity) == (GROWTH,) * 3
    assert tuple(released.keys) == tuple(cache.buffers(layer, 1, like)[0].data_ptr() for layer in range(3))


def test_a_batched_pass_gives_each_sequence_its_unbatched_logits() -> None:
    model = adapted()
    mask = model.mask_id
    masks = (mask,) * 4
    contexts = prompts(4, seed=1)
    cache = SlotCache(4)
    for slot, context in enumerate(contexts):
        prefill(model, cache, slot, context)
    rounds = [
        # different cached lengths, different rows per pass; slots 0, 2, 3: not contiguous (the gathered path)
        ([0, 2, 3], [Feed((5, 6, 7), masks), Feed((8,), masks), Feed((9, 10, 11, 12, 13), masks)]),
        # a common noisy suffix (self-speculative and diffusion rows side by side: the adapter on the suffix only)
        ([0, 1, 2], [Feed((14,), masks), Feed((15, 16, 17, 18), (19, mask, mask, mask)), Feed((20,), masks)]),
        # no common suffix: autoregressive rows next to drafting ones (the adapter gated row by row)
        ([1, 2, 3], [Feed((21,)), Feed((22, 23), masks), Feed((24, 25, 26))]),
    ]
    for slots, feeds in rounds:
        outs = batched_pass(model, cache, slots, feeds)
        for slot, feed, (clean, noisy) in zip(slots, feeds, outs, strict=True):
            expected = reference_logits(model, cache.slots[slot].ids, feed)
            torch.testing.assert_close(clean, expected[: len(feed.clean)], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(noisy, expected[len(feed.clean) :], atol=1e-4, rtol=1e-4)
            keep(cache, slot, feed, len(feed.clean) - 1)  # the slots grow by different amounts


def test_mask_blocks_after_each_clean_prefix_see_only_that_prefix() -> None:
    """`Feed.after`: the block after the first g clean tokens gives the logits of a pass that fed only those g tokens
    and that block, whatever the other blocks and tokens in the pass."""
    model = adapted()
    mask = model.mask_id
    context = prompts(1, seed=4)[0]
    clean = (5, 6, 7)
    cache = SlotCache(1)
    prefill(model, cache, 0, context)
    after = (1, 1, 1, 2, 2, 2, 3, 3, 3)
    [(clean_logits, noisy_logits)] = batched_pass(model, cache, [0], [Feed(clean, (mask,) * 9, after)])
    for g in (1, 2, 3):
        expected = reference_logits(model, context, Feed(clean[:g], (mask,) * 3))
        torch.testing.assert_close(noisy_logits[3 * (g - 1) : 3 * g], expected[g:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(clean_logits, reference_logits(model, context, Feed(clean))[:3], atol=1e-4,
                               rtol=1e-4)
    with pytest.raises(ValueError, match="ascending"):
        Feed(clean, (mask,) * 2, (2, 1))


@pytest.fixture
def passes() -> Iterator[PassLog]:
    """Every pass the runners make during the test, with the slots it carried."""
    with PassLog() as log:
        yield log


def stream(refinements: Iterator[Refinement]) -> list[tuple[object, ...]]:
    """What a caller sees of an answer, pass by pass (timings aside)."""
    return [(r.tokens, r.committed, r.done, r.finish_reason) for r in refinements]


def alone(prompt: list[int], config: SamplerConfig, length: int, options: GenerationOptions = PLAIN):
    """The answer decoded by itself, on a fresh model and a runner of its own that decodes one answer a pass."""
    chat = DiffusionChatModel("tiny", None, BlockDiffusionBackend(adapted(), [EOS], max_batch=1), config)
    try:
        return stream(answer_refinements(chat, prompt, length, config, options))
    finally:
        stop_batching(chat)


def engine() -> DiffusionChatModel:
    return DiffusionChatModel("tiny", byte_tokenizer(), BlockDiffusionBackend(adapted(), [EOS]), MODES["diffusion"])


def requests(count: int) -> list[tuple[list[int], SamplerConfig, int, GenerationOptions]]:
    """Prompts of different lengths in every mode, greedy, and a sampled one (its own seeded generator)."""
    modes = list(MODES.values())
    out = [(prompt, modes[i % len(modes)], 12 + 4 * (i % 3), PLAIN) for i, prompt in enumerate(prompts(count, seed=3))]
    sampled = GenerationOptions(temperature=0.8, seed=7)
    out.append((prompts(1, seed=9)[0], MODES["self-speculative"], 16, sampled))
    return out


def drain(run: Run, cancel: threading.Event | None = None, cancel_after: int | None = None) -> list[Refinement]:
    out = []
    for refinement in run:
        out.append(refinement)
        if cancel is not None and len(out) == cancel_after:
            cancel.set()
    return out


def drain_together(runs: list[Run]) -> list[list[Refinement]]:
    """Every run's Refinements, each read by its own thread at the same time (as concurrent callers read them)."""
    results: list[list[Refinement]] = [[] for _ in runs]
    threads = [threading.Thread(target=lambda i=i, run=run: results.__setitem__(i, drain(run)))
               for i, run in enumerate(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_answers_in_a_batch_equal_their_answers_alone_in_every_mode(passes: PassLog) -> None:
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    cases = requests(9)
    runs = [runner.submit(sequence(chat, prompt, length, config, options)) for prompt, config, length, options in cases]
    results = drain_together(runs)
    assert max(passes.sizes) >= 4  # the answers really shared passes
    for i, (prompt, config, length, options) in enumerate(cases):
        assert stream(iter(results[i])) == alone(prompt, config, length, options), (i, config.decoding)
        assert results[i][-1].done


def test_a_bare_answer_runs_through_the_runner_and_equals_its_answer_alone(passes: PassLog) -> None:
    # what the benchmarks time (eval_default_model, bench_llama_cpp): the loop every answer runs, on the runner's
    # thread, not a second loop on the caller's (whose OpenMP team would slow the runner's passes)
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    for prompt, config, length, options in requests(3):
        before = len(passes.sizes)
        got = stream(answer_refinements(chat, prompt, length, config, options))
        assert len(passes.sizes) - before == len(got)  # every pass of it the runner's
        assert got == alone(prompt, config, length, options), config.decoding
    assert runner._thread is not None and runner._thread is not threading.current_thread()


def test_a_run_cancelled_mid_batch_leaves_the_others_unchanged() -> None:
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    cases = requests(5)[:5]
    cancels = [threading.Event() for _ in cases]
    runs = [runner.submit(sequence(chat, prompt, length, config, options), cancel=cancel)
            for (prompt, config, length, options), cancel in zip(cases, cancels, strict=True)]
    results: dict[int, list[Refinement]] = {}
    victim = 1

    def consume(i: int) -> None:
        results[i] = drain(runs[i], cancels[i], 2 if i == victim else None)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # passes the runner made before it saw the cancel may already be queued (it runs ahead of a slow reader), so the
    # bound is the uncancelled answer's pass count, not the cancel point
    prompt, config, length, options = cases[victim]
    assert results[victim][-1].finish_reason == "cancelled"
    assert len(results[victim]) < len(alone(prompt, config, length, options))
    for i, (prompt, config, length, options) in enumerate(cases):
        if i != victim:
            assert stream(iter(results[i])) == alone(prompt, config, length, options), i
    # an abandoned iterator (the caller went away) ends its run too, and the runner goes on serving
    prompt, config, length, options = cases[0]
    abandoned = iter(runner.submit(sequence(chat, prompt, length, config, options)))
    next(abandoned)
    abandoned.close()
    again = drain(runner.submit(sequence(chat, prompt, length, config, options)))
    assert stream(iter(again)) == alone(prompt, config, length, options)


def waiting_answer(interactive: bool, arrived: float) -> Run:
    """A submitted answer as admission sees it (admission runs no pass)."""
    answer = sequence(engine(), [5, 6, 7], 8, MODES["self-speculative"])
    return Run(answer.cached_prompt, answer, interactive=interactive, cancel=None, arrived=arrived)


def test_interactive_runs_are_admitted_first_and_bulk_ones_one_at_a_time() -> None:
    run = waiting_answer
    bulk_a, bulk_b, voice_a, voice_b = run(False, 1.0), run(False, 2.0), run(True, 3.0), run(True, 4.0)
    assert admission([bulk_a, bulk_b, voice_b, voice_a], free=8) == [voice_a, voice_b]
    assert admission([bulk_a, bulk_b, voice_b, voice_a], free=1) == [voice_a]
    assert admission([bulk_b, bulk_a], free=8) == [bulk_a]
    assert admission([bulk_a, voice_a], free=0) == []


def test_the_engine_streams_concurrent_answers_through_one_runner() -> None:
    chat = engine()
    prompt_sets = prompts(4, seed=5)
    options = GenerationOptions(max_new_tokens=12)
    texts: dict[int, str] = {}

    def answer(i: int) -> None:
        texts[i] = list(chat.stream_prompt(prompt_sets[i], options))[-1].text

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for i, prompt in enumerate(prompt_sets):
        assert texts[i] == list(chat.stream_prompt(prompt, options))[-1].text


def test_the_api_scheduler_runs_concurrent_jobs_in_shared_passes(passes: PassLog) -> None:
    import asyncio

    from model.chat import ChatMessage
    from model.server.scheduler import Scheduler
    from scripts.report_lib.tiny_models import word_tokenizer

    chat = DiffusionChatModel("tiny", word_tokenizer(), BlockDiffusionBackend(adapted(), [EOS]), MODES["diffusion"])
    questions = ["hello how are you", "what is your name", "the cat and the dog", "good day"]
    options = GenerationOptions(max_new_tokens=16)

    async def serve_all() -> list[str]:
        scheduler = Scheduler(chat, max_queue=8)
        jobs = [scheduler.submit([ChatMessage("user", q)], options) for q in questions]
        texts = []
        for job in jobs:
            texts.append([draft async for draft in job.stream()][-1].text)
        await scheduler.close()
        return texts

    assert chat.max_batch > 1
    texts = asyncio.run(serve_all())
    assert max(passes.sizes) >= 2  # the jobs ran at the same time, in shared passes
    assert texts == [list(chat.stream_chat([ChatMessage("user", q)], options))[-1].text for q in questions]


def test_a_voice_turn_asks_the_model_for_priority() -> None:
    import asyncio

    from model.chat import ChatMessage
    from tests.unit.test_session_shell import FakeLM
    from voice.think.lm_run import LmRun
    from voice.turn.answer import session_options
    from voice.turn.config import SessionConfig

    lm = FakeLM()
    asked: list[bool] = []
    stream_chat = lm.stream_chat

    def recording(messages, options, cancel=None):
        asked.append(options.interactive)
        return stream_chat(messages, options, cancel)

    lm.stream_chat = recording  # type: ignore[method-assign]

    async def turn() -> None:
        options = session_options(SessionConfig(), "s1")
        run = LmRun(lm, [ChatMessage("user", "hi")], options, name="lm-test")
        async for _ in run.drafts():
            pass
        await run.close()

    asyncio.run(turn())
    assert asked == [True]


def test_an_interactive_answer_runs_its_first_pass_ahead_of_waiting_bulk_ones(passes: PassLog) -> None:
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    config = MODES["self-speculative"]
    with runner._condition:  # the runner admits nothing until all four wait
        bulk = [runner.submit(sequence(chat, p, 12, config)) for p in prompts(3, seed=11)]
        voice = runner.submit(sequence(chat, prompts(1, seed=12)[0], 12, config), interactive=True)
    for run in [*bulk, voice]:
        drain(run)
    assert passes.first_pass_of(voice.slot) == 0 and passes.sizes[0] == 1  # alone, before any bulk pass
    assert all(passes.first_pass_of(run.slot) > 0 for run in bulk)


class FailingSequence:
    """A real sequence whose decoding raises at its second pass (a bug in one answer's step function)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.cached_prompt = inner.cached_prompt
        self.passes = 0

    def feed(self, crowd: int = 1) -> Feed:
        return self.inner.feed(crowd)

    def consume(self, clean, noisy, elapsed_s, cancelled=False):
        self.passes += 1
        if self.passes == 2:
            raise RuntimeError("a bug in one answer's decoding")
        return self.inner.consume(clean, noisy, elapsed_s, cancelled)


def test_one_answer_failing_ends_only_that_answer() -> None:
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    cases = requests(3)[:3]
    with runner._condition:
        runs = [runner.submit(sequence(chat, p, n, c, o)) for p, c, n, o in cases]
        broken = runner.submit(FailingSequence(sequence(chat, cases[0][0], cases[0][2], cases[0][1], cases[0][3])))
    with pytest.raises(RuntimeError, match="one answer's decoding"):
        drain(broken)
    for run, (prompt, config, length, options) in zip(runs, cases, strict=True):
        assert stream(iter(drain(run))) == alone(prompt, config, length, options)


def test_closing_the_runner_ends_its_answers_and_stops_its_thread() -> None:
    """At interpreter exit (atexit) the runner stops after the pass in flight, so no torch op outlives the
    interpreter; answers still running end with an error instead of waiting forever."""
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    prompt, config, length, options = requests(1)[0]
    running = iter(runner.submit(sequence(chat, prompt, length, config, options)))
    next(running)  # the runner thread is up and the answer is in a slot
    runner.close()
    assert runner._thread is not None and not runner._thread.is_alive()
    try:  # the answer either finished before the close or ends with the error: it never waits forever
        assert list(running)[-1].done
    except ModelError as error:
        assert "shutting down" in str(error)
    with pytest.raises(ModelError, match="shutting down"):
        runner.submit(sequence(chat, prompt, length, config, options))


def test_a_long_prompt_gives_its_cache_back_when_its_answer_ends() -> None:
    """One long prompt grows every slot's buffer; once its answer is done the buffers shrink back to what the other
    slots hold, and the answer still running beside it is unchanged."""
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    config = MODES["self-speculative"]
    short = prompts(1, seed=11)[0]
    long_prompt = [3 + (i * 7) % (LLAMA_VOCAB - 3) for i in range(KEEP_AFTER_ANSWER + 300)]
    beside = iter(runner.submit(sequence(chat, short, 24, config)))
    first = next(beside)  # running, in its slot, when the long prompt comes
    long_answer = drain(runner.submit(sequence(chat, long_prompt, 4, config)))
    assert long_answer[-1].done
    assert stream(iter([first, *beside])) == alone(short, config, 24)
    assert runner.cache.capacity <= 2 * GROWTH
    assert all(len(slot.ids) <= KEEP_AFTER_ANSWER for slot in runner.cache.slots)


def test_a_short_prompt_stays_cached_for_the_next_turn() -> None:
    cache = SlotCache(2)
    model = adapted()
    prefill(model, cache, 0, list(range(3, 40)))
    cache.release(0)
    assert cache.slots[0].ids == list(range(3, 40))  # a voice session's next prompt starts with this one
    assert prefill(model, cache, 0, list(range(3, 45)))[0] == 37


def test_max_batch_bounds_the_answers_in_a_pass(passes: PassLog) -> None:
    chat = DiffusionChatModel("tiny", byte_tokenizer(), BlockDiffusionBackend(adapted(), [EOS], max_batch=2),
                              MODES["diffusion"])
    assert chat.max_batch == 2
    cases = requests(4)[:4]
    runs = [chat.backend.runner.submit(sequence(chat, prompt, length, config, options))
            for prompt, config, length, options in cases]
    results = drain_together(runs)
    assert max(passes.sizes) == 2
    for i, (prompt, config, length, options) in enumerate(cases):
        assert stream(iter(results[i])) == alone(prompt, config, length, options), i
    with pytest.raises(ModelError, match="max_batch"):
        BlockDiffusionBackend(adapted(), [EOS], max_batch=0)


def test_the_adapter_runs_only_from_the_longest_noisy_run_on() -> None:
    from model.bundled.block_diffusion import noisy_suffix

    def rows(*patterns: str) -> torch.Tensor:
        return torch.tensor([[c == "n" for c in pattern] for pattern in patterns])

    assert noisy_suffix(rows("ccnn", "ccnn")) == (2, None)  # the same count everywhere: no mask
    start, mask = noisy_suffix(rows("cccn", "ccnn", "cccc"))  # each sequence's own count (one with drafts per outcome)
    assert start == 2 and mask.tolist() == [[False, True], [True, True], [False, False]]
    assert noisy_suffix(rows("cncn")) is None  # not a suffix (training batches): the adapter gated row by row
    assert noisy_suffix(rows("cccc")) == (4, None)


def test_a_long_answer_ending_in_a_pass_keeps_what_the_others_in_that_pass_just_kept() -> None:
    """The long prompt's slot (0) ends in a pass that a longer-running answer (slot 1) shares: the buffers shrink to
    what slot 1 holds only after slot 1 has kept this pass's tokens, or their keys would be lost."""
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    config = MODES["autoregressive"]
    long_prompt = [3 + (i * 7) % (LLAMA_VOCAB - 3) for i in range(KEEP_AFTER_ANSWER + 300)]
    medium = [3 + (i * 5) % (LLAMA_VOCAB - 3) for i in range(400)]
    long_run = runner.submit(sequence(chat, long_prompt, 12, config))
    medium_run = runner.submit(sequence(chat, medium, 28, config))
    long_answer, medium_answer = drain_together([long_run, medium_run])
    assert (long_run.slot, medium_run.slot) == (0, 1)
    assert len(medium_answer) > len(long_answer)  # it went on after the long one ended
    assert stream(iter(medium_answer)) == alone(medium, config, 28)
    assert runner.cache.capacity < KEEP_AFTER_ANSWER
    # every key slot 1 holds is the one a fresh prefill of its tokens gives (a lost key would read as zeros)
    held = list(runner.cache.slots[1].ids)
    fresh = SlotCache(1)
    prefill(chat.backend.model, fresh, 0, held)
    for warm, cold in ((runner.cache._keys, fresh._keys), (runner.cache._values, fresh._values)):
        for warm_layer, cold_layer in zip(warm, cold, strict=True):
            torch.testing.assert_close(warm_layer[1, :, : len(held)], cold_layer[0, :, : len(held)], atol=1e-5,
                                       rtol=1e-5)


def test_a_lone_answer_drafts_after_every_draft_and_a_batched_one_after_all(passes: PassLog) -> None:
    """Blocks after every draft pay off only when an answer has the pass to itself; in a batch each answer drafts one
    block. Either way the answer is the same tokens as alone (drafts only change the speed)."""
    config = SamplerConfig(block_length=4, steps_per_block=4, decoding="self-speculative", draft_masks=3)
    decoding = sequence(engine(), prompts(1, seed=6)[0], 16, config)
    decoding.drafts = [5, 6]
    assert decoding.feed(1).after == (1, 1, 1, 2, 2, 2, 3, 3, 3)
    batched = decoding.feed(4)
    assert batched.clean == (decoding.last, 5, 6) and batched.after == () and len(batched.noisy) == 3
    chat = engine()
    cases = [(prompt, config, 20) for prompt in prompts(4, seed=8)]
    runs = [chat.backend.runner.submit(sequence(chat, prompt, length, c)) for prompt, c, length in cases]
    results = drain_together(runs)
    assert max(passes.sizes) >= 2
    for i, (prompt, c, length) in enumerate(cases):
        final = results[i][-1]
        assert final.done and list(final.tokens) == final_tokens_alone(prompt, c, length), i


def final_tokens_alone(prompt: list[int], config: SamplerConfig, length: int) -> list[int]:
    return list(alone(prompt, config, length)[-1][0])


def test_a_prompt_prepared_ahead_is_reused_by_the_answer_that_follows() -> None:
    chat = engine()
    history = [ChatMessage("user", "Hi there."), ChatMessage("assistant", "Hello! How can I help?")]
    shared = chat.next_prompt_prefix(history)
    question_ids = chat.prompt_ids([*history, ChatMessage("user", "What now?")])
    other_ids = chat.prompt_ids([*history, ChatMessage("user", "b")])
    assert question_ids[: len(shared)] == shared == other_ids[: len(shared)]  # the history and the user header ...
    assert question_ids[len(shared)] != other_ids[len(shared)]  # ... and nothing of the user's words
    assert len(shared) > len(chat.prompt_ids(history[:1]))
    begun = chat.next_prompt_prefix(history, words=" What ")  # the words a partial transcript committed so far
    assert question_ids[: len(begun)] == begun and len(begun) > len(shared)  # ... are encoded too
    assert chat.next_prompt_prefix(history, words="Why")[: len(begun)] != begun

    prefix, rest = prompts(2, seed=9)  # the tiny model's own vocabulary
    question = prefix + rest
    runner = chat.backend.runner
    assert list(runner.prepare(prefix)) == []  # encoded; a prompt encoded ahead has no passes
    config = MODES["self-speculative"]
    run = runner.submit(sequence(chat, question, 8, config), interactive=True)
    assert stream(iter(drain(run))) == alone(question, config, 8)
    assert run.reused_tokens == len(prefix)
    cold = engine().backend.runner.submit(sequence(chat, question, 8, config), interactive=True)
    drain(cold)
    assert cold.reused_tokens == 0


def test_a_prompt_prepared_ahead_waits_until_no_answer_is_decoding() -> None:
    ahead = Run([1, 2], None, interactive=False, cancel=None, arrived=1.0)  # what `BatchRunner.prepare` queues
    bulk, voice = waiting_answer(False, 2.0), waiting_answer(True, 3.0)
    assert admission([ahead, bulk, voice], free=8) == [voice]
    assert admission([ahead, bulk], free=8) == [bulk]  # an answer before any prompt encoded ahead
    assert admission([ahead], free=8, busy=True) == []  # never delays the passes of answers in flight
    assert admission([ahead], free=8) == [ahead]


def test_a_short_uncached_prompt_is_encoded_by_the_answers_first_pass() -> None:
    chat = engine()
    runner = chat.backend.runner
    model = chat.backend.model
    forwards: list[int] = []  # rows of every forward the runner runs
    fused = model.inference_pass()

    def counting(input_ids, *args, **kwargs):
        forwards.append(input_ids.shape[1])
        return fused(input_ids, *args, **kwargs)

    model.inference_pass = lambda: counting
    prefix = prompts(1, seed=9)[0]
    list(runner.prepare(prefix))  # a voice session's history and user header, encoded ahead
    for mode in ("self-speculative", "autoregressive", "diffusion"):
        config = MODES[mode]
        for tail in (3, FOLD_LIMIT, FOLD_LIMIT + 1):  # uncached tokens before the prompt's last one
            question = prefix + [(7 * i) % (LLAMA_VOCAB - 3) + 3 for i in range(tail + 1)]
            forwards.clear()
            run = runner.submit(sequence(chat, question, 8, config), interactive=True)
            refinements = drain(run)
            assert stream(iter(refinements)) == alone(question, config, 8), (mode, tail)
            assert run.reused_tokens == len(prefix)
            prefills = len(forwards) - len(refinements)
            # the new words and the prompt's last token are the first pass's first rows; a longer tail gets a
            # prefill of its own
            assert prefills == (0 if tail <= FOLD_LIMIT else 1), (mode, tail)
            assert forwards[prefills] >= (tail + 1 if tail <= FOLD_LIMIT else 1)
            runner.cache.slots[run.slot].ids[len(prefix):] = []  # the next question starts after the prefix again


def test_conversations_taking_turns_keep_their_prompts_encoded_ahead() -> None:
    # Every prompt shares the system prompt: a slot chosen for that alone let two voice sessions take turns in one
    # slot, each overwriting the other's prompt encoded ahead, and each turn re-encoded its whole history. An API
    # request (no conversation) that shares only the system prompt takes a free slot too.
    chat = engine()
    runner = chat.backend.runner
    system = [5, 6, 7, 8, 9, 10]
    prefixes = {owner: [*system, *prompts(1, seed=seed)[0]] for owner, seed in (("a", 21), ("b", 22))}
    config = MODES["self-speculative"]
    for owner, prefix in prefixes.items():
        list(runner.prepare(prefix, owner=owner))
    for turn in range(3):
        for owner, prefix in prefixes.items():
            if turn == 1:  # bulk work in between
                drain(runner.submit(sequence(chat, [*system, 40, 41, 42], 8, config)))
            run = runner.submit(sequence(chat, [*prefix, 11, 12, 13], 8, config), interactive=True, owner=owner)
            drain(run)
            assert run.reused_tokens == len(prefix), (turn, owner)
            list(runner.prepare(prefix, owner=owner))  # its next prompt starts the same way again


def test_a_runner_standing_aside_starts_no_pass_until_released_or_out_of_time(passes: PassLog) -> None:
    """While a voice answer's first phrase is synthesised the passes hold (voice/speak/stage.py): none starts until
    the hold is released, and a hold never released runs out after its seconds."""
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    prompt, config, length, options = requests(1)[0]
    try:
        with runner.standing_aside(30.0):
            held = runner.submit(sequence(chat, prompt, length, config, options))
            time.sleep(0.3)
            assert passes.slots == [] and held.slot is None  # not even admitted: no prefill, no pass
        assert drain(held)[-1].done
        started = time.monotonic()
        with runner.standing_aside(0.2):
            assert drain(runner.submit(sequence(chat, prompt, length, config, options)))[-1].done
        assert time.monotonic() - started >= 0.2
    finally:
        stop_batching(chat)


class Untimed:
    """A real sequence that notes which of its passes the runner marked untimed (`TimesItsPasses`)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.cached_prompt = inner.cached_prompt
        self.passes = 0
        self.untimed_passes: list[int] = []

    def feed(self, crowd: int = 1) -> Feed:
        return self.inner.feed(crowd)

    def untimed(self) -> None:
        self.untimed_passes.append(self.passes)

    def consume(self, clean, noisy, elapsed_s, cancelled=False):
        self.passes += 1
        return self.inner.consume(clean, noisy, elapsed_s, cancelled)


class Spare:
    """What `SpareCores.shared()` answers in these tests."""

    def __init__(self, spare: bool) -> None:
        self.spare = spare
        self.handovers: list[int] = []  # the team of each pass handed over

    def allows(self, threads: int) -> bool:
        return self.spare

    def handed_over(self, start: float, end: float, threads: int = 1) -> None:
        assert start <= end
        self.handovers.append(threads)


def test_a_leads_passes_run_on_the_wider_team_only_where_the_cores_are_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer's lead (its first `lead` tokens: its first `lead` passes at most) is decoded on `lead_threads` when the
    cores are spare, and those passes are not timed for the draft policy; every other pass keeps torch's threads (one,
    here). Every pass hands its cores over to what follows. The answer is the same either way."""
    from model.runtime import batch_runner
    from model.spare_cores import SpareCores, usable_cores

    if usable_cores() < 2:
        pytest.skip("one core: no wider team to take")
    teams: list[int] = []
    real = batch_runner.tapped_pass

    def recording(*args, **kwargs):
        teams.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_runner, "tapped_pass", recording)
    chat = engine()
    runner: BatchRunner = chat.backend.runner
    prompt, config = prompts(1, seed=21)[0], MODES["autoregressive"]
    answers = {}
    for spare, lead in ((True, 3), (False, 3), (True, 0)):
        gauge = Spare(spare)
        monkeypatch.setattr(SpareCores, "running", classmethod(lambda cls, gauge=gauge: gauge))
        teams.clear()
        wrapped = Untimed(sequence(chat, prompt, 8, config))
        answers[spare, lead] = stream(iter(drain(runner.submit(wrapped, lead=lead))))
        wide = spare and lead > 0
        assert teams == [2] * 3 * wide + [1] * (8 - 3 * wide), (spare, lead)  # one token a pass: 3 passes lead
        assert wrapped.untimed_passes == [0, 1, 2] * wide
        assert gauge.handovers == teams  # every pass handed over to the next, with its team
        assert torch.get_num_threads() == 1  # given back
    assert answers[True, 3] == answers[False, 3] == answers[True, 0]
    monkeypatch.setattr(SpareCores, "running", classmethod(lambda cls: None))  # no voice served: no sampler, no lead
    teams.clear()
    drain(runner.submit(sequence(chat, prompt, 8, config), lead=3))
    assert teams == [1] * 8


def test_a_fault_in_the_runners_own_step_ends_the_answers_in_flight_and_the_runner_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fault outside a pass and a decoding step (here: keeping a pass's tokens in the cache) ends the answers in
    flight with a clear error instead of killing the runner's thread, whose callers would then wait forever."""
    from model.runtime import batch_runner

    chat = engine()
    runner: BatchRunner = chat.backend.runner
    prompt, config, length, options = requests(1)[0]
    kept = batch_runner.keep
    faults = iter([True])

    def failing_keep(*args):  # type: ignore[no-untyped-def]
        if next(faults, False):
            raise RuntimeError("bookkeeping broke")
        return kept(*args)

    monkeypatch.setattr(batch_runner, "keep", failing_keep)
    with pytest.raises(ModelError, match="bookkeeping broke"):
        drain(runner.submit(sequence(chat, prompt, length, config, options)))
    again = drain(runner.submit(sequence(chat, prompt, length, config, options)))
    assert stream(iter(again)) == alone(prompt, config, length, options)
