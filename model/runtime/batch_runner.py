"""One thread that runs the passes of every answer in flight on a block-diffusion model as one batched forward: the
only loop that decodes the bundled model, in every mode, for one answer or many, and its `SlotCache` the model's only
KV cache.

Callers (the HTTP scheduler's jobs, voice sessions, `dlm generate`) each submit a *sequence*: an answer's decoding as a
step object (model/decoding/step.py: `feed()` -> the rows of its next pass; `consume(logits)` -> a `Refinement` and
how many rows the cache keeps). `SpeculativeDecoding` (self-speculative and autoregressive) and `DiffusionSequence`
(the threshold sampler) are both sequences, so any mix of modes shares a pass. The loop::

    admit waiting sequences into free cache slots (interactive first), encode their prompts
    one forward over the next pass of every admitted sequence (model/runtime/batching.py), and the next part of the
        prompts of answers admitted while others decode (on a model whose passes take any rows: `_start_filling`)
    hand each its logits; send each Refinement to its caller; free the slots of finished answers

A single answer is a batch of one through the same code. Priority: an interactive sequence (a voice session's answer)
is admitted ahead of bulk ones and its first pass runs at once, alone, right after its prefill; bulk sequences are
admitted one per loop turn, so a burst of API requests cannot delay a voice turn by several prefills. Cancellation:
the caller's `cancel` event is read between passes, so a cancelled answer ends after the pass in flight with a
"cancelled" Refinement and its slot is freed; the other sequences in the batch are unaffected (their rows never see
it: see the attention mask in model/runtime/batching.py).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from model.decoding.refinement import Refinement
from model.decoding.step import DecodingSequence, Feed, FoldsPrompt, ReadsPromptRow, ReadsTaps, TimesItsPasses
from model.errors import GenerationCancelled, ModelError
from model.process import watch
from model.process.threads import torch_threads
from model.runtime.batching import SlotCache, common_prefix, keep, prefill, rows_pass_of, tapped_pass
from model.spare_cores import SpareCores, usable_cores

log = logging.getLogger(__name__)
_RUNNERS: weakref.WeakSet[BatchRunner] = weakref.WeakSet()


@atexit.register
def _stop_runners() -> None:
    """Let each runner finish the pass in flight before the interpreter exits: a daemon thread still inside a torch
    op while the interpreter tears down aborted a test process once ("terminate called without an active
    exception")."""
    for runner in list(_RUNNERS):
        runner.close()


DEFAULT_MAX_BATCH = 8
LEAD_THREADS = 2  # the team of passes that make a lead someone is waiting for (`BatchRunner._team`)
# A prompt whose uncached part is at most this long is encoded by its answer's first pass instead of a prefill of its
# own (a voice turn's new words: one forward less on the critical path). Rows of a pass stay within 32 (24 + the
# last token + drafting masks), where a bf16 row comes out the same whatever shares its pass
# (model/runtime/batching.py).
FOLD_LIMIT = 24
# Prompt tokens of bulk answers admitted while others decode that a pass encodes beside their rows, on a model whose
# passes take any rows (`_start_filling`): the weights stream once for both, and the others wait for a chunk, not for
# a whole prompt. A chunk costs about its rows' arithmetic (bench_lm.py --row-costs), so it bounds how much longer each
# of their passes gets while newcomers' prompts go in.
PREFILL_STEP = 32


@dataclass(eq=False)
class Run:
    """One submitted answer: iterate it for its Refinements (the last has done=True). Closing the iterator early
    (the caller went away) frees its slot after the pass in flight.

    A run without a sequence is a prompt encoded ahead of its answer (`BatchRunner.prepare`): the part of a
    conversation's next prompt known before the user's next words (the history and the user header). Encoded while
    the runner is idle, it leaves a slot holding it, so the answer's prefill, on the voice turn's critical path,
    encodes only the new words; it has no passes and no Refinements."""

    prompt: list[int]  # what its slot must hold before its first pass (the sequence's `cached_prompt`)
    sequence: DecodingSequence | None  # its passes; None: a prompt encoded ahead
    interactive: bool
    cancel: threading.Event | None
    arrived: float = field(default_factory=time.perf_counter)
    owner: str | None = None  # the conversation it continues (see `BatchRunner._slot_preference`)
    lead: int = 0  # its first tokens that someone waits for (see `BatchRunner.submit`)
    reused_tokens: int = 0  # prompt tokens found already in the slot's cache
    slot: int | None = None
    passes: int = 0
    ended: bool = False  # its last item is queued (`BatchRunner._end`)
    _out: queue.SimpleQueue[Refinement | BaseException | None] = field(default_factory=queue.SimpleQueue)
    _abandoned: threading.Event = field(default_factory=threading.Event)

    def cancelled(self) -> bool:
        return self._abandoned.is_set() or (self.cancel is not None and self.cancel.is_set())

    def __iter__(self) -> Iterator[Refinement]:
        try:
            while (item := self._out.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._abandoned.set()  # no-op once the run ended; otherwise the runner drops it


def admission(waiting: list[Run], free: int, busy: bool = False) -> list[Run]:
    """Which waiting runs to start now, given `free` slots and whether any answer is `busy` decoding: every
    interactive one that fits, in arrival order; when there is none, the oldest bulk run alone (each admission costs
    a prefill that the whole batch waits for); prompts encoded ahead (runs without a sequence) only when nothing else
    waits and no answer is decoding, so they never delay one."""
    interactive = sorted((run for run in waiting if run.interactive), key=lambda run: run.arrived)
    if interactive:
        return interactive[:free]
    answers = [run for run in waiting if run.sequence is not None]
    candidates = answers if answers or busy else waiting
    return sorted(candidates, key=lambda run: run.arrived)[:1] if free else []


class BatchRunner:
    """Drives every submitted sequence of one `BlockDiffusionLM` in batched passes, on its own thread."""

    def __init__(self, model: torch.nn.Module, max_batch: int = DEFAULT_MAX_BATCH, reuse_prompt_cache: bool = True,
                 lead_threads: int = LEAD_THREADS):
        if max_batch < 1:
            raise ModelError(f"max_batch must be at least 1, got {max_batch}")
        self.model = model
        self.max_batch = max_batch
        self.lead_threads = lead_threads  # the team of a lead's passes (`_team`), where that many cores are spare
        self.reuse_prompt_cache = reuse_prompt_cache
        self.cache = SlotCache(max_batch)
        self._condition = threading.Condition()
        self._waiting: list[Run] = []
        # admitted, prompt encoded, in a slot: each with its sequence (prompts encoded ahead are never active)
        self._active: dict[Run, DecodingSequence] = {}
        # admitted bulk answers whose prompts are encoded in the others' passes: the tokens still to encode
        self._filling: dict[Run, list[int]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._slot_used = [0] * max_batch  # when each slot was last given to a run (admission count): ties go LRU
        self._slot_owner: list[str | None] = [None] * max_batch  # the conversation whose run last had each slot
        self._admissions = 0
        self._asides: dict[object, float] = {}  # holds of `standing_aside` and when each runs out (monotonic s)
        _RUNNERS.add(self)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the runner after the pass in flight; answers still waiting or running end with an error."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def submit(self, sequence: DecodingSequence, interactive: bool = False, cancel: threading.Event | None = None,
               owner: str | None = None, lead: int = 0) -> Run:
        """Queue `sequence`; `owner` names the conversation it continues (its cache slot is kept for it). `lead`: its
        first tokens someone is waiting for (a voice answer's first phrase); the passes that make them (its first
        `lead`: every pass yields a token) run on `lead_threads` where those cores are spare (`_team`)."""
        with watch.span(watch.LM_SUBMIT):
            return self._queue(Run(sequence.cached_prompt, sequence, interactive, cancel, owner=owner, lead=lead))

    def prepare(self, tokens: list[int], cancel: threading.Event | None = None, owner: str | None = None) -> Run:
        """Encode `tokens` into a slot when the runner is idle, without an answer (a run without a sequence), for
        conversation `owner`; `cancel` drops it while it waits (its answer came first). Iterating the returned run
        waits until it is encoded."""
        return self._queue(Run(list(tokens), None, False, cancel, owner=owner))

    @contextlib.contextmanager
    def standing_aside(self, seconds: float) -> Iterator[None]:
        """No pass or prefill starts while this is held, for at most `seconds`: the process has work someone is
        waiting on that the passes would slow (a voice answer's first phrase being rendered: voice/speak/stage.py).
        The pass in flight finishes; every answer then waits, so a holder keeps it short."""
        token = object()
        with self._condition:
            self._asides[token] = time.monotonic() + seconds
        try:
            yield
        finally:
            with self._condition:
                del self._asides[token]
                self._condition.notify_all()

    def _queue(self, run: Run) -> Run:
        with self._condition:
            if self._closed:
                raise ModelError("the model is shutting down")
            self._waiting.append(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="dlm-batch-runner", daemon=True)
                self._thread.start()
            self._condition.notify()
        return run

    # --- the loop (runner thread only) --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._closed and (not (self._waiting or self._active or self._filling)
                                            or self._aside_s() > 0):
                    self._condition.wait(self._aside_s() or None)
                if self._closed:
                    for run in [*self._waiting, *self._active, *self._filling]:
                        self._end(run, ModelError("the model is shutting down"))
                    return
                arrivals = self._admit()
            try:
                fresh = [run for run in arrivals if self._encode(run)]
                urgent = [run for run in fresh if run.interactive]
                if not urgent and not self._active:
                    self._finish_filling()
                self._pass(urgent or list(self._active), fills=not urgent)
            except Exception as error:  # a fault of the loop's own bookkeeping ends the answers in flight, never the
                log.exception("batch runner step failed")  # runner: the next submitted answer is served as usual
                for run in {*arrivals, *self._active, *self._filling}:
                    if not run.ended:
                        self._end(run, ModelError(f"the model's runner failed: {error}"))

    def _aside_s(self) -> float:
        """Seconds until every `standing_aside` hold is released or runs out (0: none holds); called locked."""
        return max(0.0, max(self._asides.values(), default=0.0) - time.monotonic())

    def _admit(self) -> list[Run]:
        """Move the `admission` choice of waiting runs into free slots (called locked)."""
        for run in [run for run in self._waiting if run.cancelled()]:
            self._waiting.remove(run)
            self._end(run, GenerationCancelled("cancelled while waiting for the model"))
        for run in [run for run in self._filling if run.cancelled()]:
            self._end(run, GenerationCancelled("cancelled while encoding the prompt"))
        taken = {run.slot for run in (*self._active, *self._filling)}
        free = [slot for slot in range(self.max_batch) if slot not in taken]
        chosen = admission(self._waiting, len(free), busy=bool(self._active or self._filling))
        for run in chosen:
            self._waiting.remove(run)
            slot = max(free, key=lambda s: self._slot_preference(s, run))
            free.remove(slot)
            run.slot = slot
            self._slot_owner[slot] = run.owner
            self._admissions += 1
            self._slot_used[slot] = self._admissions
        return chosen

    def _slot_preference(self, slot: int, run: Run) -> tuple[bool, int, int, int]:
        """How well `slot` suits `run` (higher is better): the slot of its own conversation first; then, among slots
        no other conversation owns, the one that already holds most of its prompt; then the least recently used.
        Every prompt shares the system prompt, and choosing a slot for that alone let two voice sessions take turns
        in one slot, each overwriting the other's prompt encoded ahead (57-87 tokens re-encoded a turn, not 9-17)."""
        owner = self._slot_owner[slot]
        mine = run.owner is not None and owner == run.owner
        others = owner is not None and not mine
        shared = 0 if others else common_prefix(self.cache.slots[slot].ids, run.prompt)
        return mine, shared, -self._slot_used[slot], -slot

    def _encode(self, run: Run) -> bool:
        """Prefill `run`'s prompt into its slot; on failure end the run with the error, and a prompt encoded ahead
        once it is in. True when the run goes on to its passes (it is active).

        A short uncached part goes into the run's first pass instead (`FOLD_LIMIT`), when that pass runs alone: an
        interactive run's does, and so does any run's when nothing else is decoding (otherwise every answer in the
        pass would be padded to the folded rows)."""
        with watch.span(watch.LM_PREFILL):
            return self._encode_run(run)

    def _encode_run(self, run: Run) -> bool:
        assert run.slot is not None
        sequence = run.sequence
        if sequence is not None and self._start_filling(run, sequence):
            return False
        if sequence is not None and self._fold(run, sequence):
            with self._condition:
                self._active[run] = sequence
            return True
        try:
            prompt = run.prompt
            probe = sequence if isinstance(sequence, ReadsPromptRow) and run.interactive else None
            if probe is not None:  # stop right after the probe's row: the prefill's output there is what it reads
                del self.cache.slots[run.slot].ids[probe.row :]  # even when an earlier prompt cached that token
                run.reused_tokens, logits = prefill(self.model, self.cache, run.slot, prompt[: probe.row + 1],
                                                    self.reuse_prompt_cache, run.cancel)
                if logits is not None:
                    probe.prefilled(logits)
            reused, _ = prefill(
                self.model, self.cache, run.slot, prompt, self.reuse_prompt_cache, run.cancel
            )
            if probe is None:
                run.reused_tokens = reused
        except Exception as error:  # forwarded to the caller, who raises it
            self.cache.slots[run.slot].ids.clear()  # a partial prefill is never reused
            self._end(run, error)
            return False
        if sequence is None:  # encoded ahead: the slot keeps the prompt for the answer that will share it
            self._end(run, None)
            return False
        with self._condition:
            self._active[run] = sequence
        return True

    def _start_filling(self, run: Run, sequence: DecodingSequence) -> bool:
        """Encode a bulk answer's prompt in the passes of the answers already decoding, beside their rows
        (`_fill_chunks`), rather than in a prefill they all wait for (llama.cpp's server and vLLM interleave a
        newcomer's prompt so): on a model whose passes take any rows, where a row's keys and its answer's do not
        depend on what shares its pass (model/runtime/fast_pass.py `rows_pass`). The prompt's last part goes into
        the answer's own first pass (`fold_prompt`). True when the run fills: a prompt whose uncached part is longer
        than one step. A shorter one is prefilled as before: folded into a shared pass, the bundled model's API
        throughput at 4-8 clients measured lower (bench_api.py, two runs; the cause was not isolated: the folded
        rows' logits, which no one reads, are one candidate)."""
        if run.interactive or not self._active or not isinstance(sequence, FoldsPrompt):
            return False
        if rows_pass_of(self.model) is None:
            return False
        held = self.cache.slots[run.slot].ids
        start = common_prefix(held, run.prompt) if self.reuse_prompt_cache else 0
        if len(run.prompt) - start <= PREFILL_STEP:
            return False  # a short prompt's own prefill costs the others one short pass
        del held[start:]
        run.reused_tokens = start
        rest = run.prompt[start:]
        folded = min(len(rest), PREFILL_STEP)
        sequence.fold_prompt(rest[len(rest) - folded :])
        with self._condition:
            self._filling[run] = rest[: len(rest) - folded]
        return True

    def _fill_chunks(self) -> tuple[list[Run], list[Feed]]:
        """The filling runs' prompt parts for the next pass: `PREFILL_STEP` tokens in all, the oldest arrival's
        first, so that however many answers arrive at once a pass grows by one step's rows."""
        budget, runs, chunks = PREFILL_STEP, [], []
        for run in sorted(self._filling, key=lambda run: run.arrived):
            if budget <= 0:
                break
            part = tuple(self._filling[run][:budget])
            budget -= len(part)
            runs.append(run)
            chunks.append(Feed(part, logits=False))
        return runs, chunks

    def _finish_filling(self) -> None:
        """Nothing decodes any more: what the filling runs still lack is encoded at once, each in one prefill (no
        pass of others to share), and they become active."""
        for run in list(self._filling):
            rest = self._filling.pop(run)
            assert run.slot is not None and run.sequence is not None
            held = self.cache.slots[run.slot].ids
            try:
                prefill(self.model, self.cache, run.slot, [*held, *rest], self.reuse_prompt_cache, run.cancel)
            except Exception as error:  # forwarded to the caller, who raises it
                held.clear()
                self._end(run, error)
                continue
            with self._condition:
                self._active[run] = run.sequence

    def _fold(self, run: Run, sequence: DecodingSequence) -> bool:
        if not isinstance(sequence, FoldsPrompt) or not (run.interactive or not self._active):
            return False
        held = self.cache.slots[run.slot].ids
        prompt = run.prompt
        start = common_prefix(held, prompt) if self.reuse_prompt_cache else 0
        if isinstance(sequence, ReadsPromptRow):  # the probe's row is a row of the pass, even if cached
            start = min(start, sequence.row)
        if not 0 < len(prompt) - start <= FOLD_LIMIT:
            return False
        del held[start:]
        run.reused_tokens = start
        sequence.fold_prompt(prompt[start:])
        return True

    def _pass(self, runs: list[Run], fills: bool = False) -> None:
        """One batched forward over `runs`' next passes (and, with `fills`, the next part of each filling run's
        prompt); every run gets its Refinement (or the error)."""
        if not runs:
            return
        with watch.span(watch.LM_PASS):
            self._pass_of(runs, fills)

    def _pass_of(self, runs: list[Run], fills: bool) -> None:
        """`_pass` inside its span."""
        runs = sorted(runs, key=lambda run: run.slot)  # ascending slots: the cache returns views when contiguous
        sequences = [self._active[run] for run in runs]
        filling, chunks = self._fill_chunks() if fills else ([], [])
        started = time.perf_counter()
        try:
            feeds = [sequence.feed(len(runs)) for sequence in sequences]
            slots = [run.slot for run in (*runs, *filling)]
            with self._team(runs, sequences), watch.span(watch.LM_FORWARD) as forward:
                if forward is not None:  # told before any answer hears of the pass
                    forward.detail = tuple(slots)
                logits, tapped = tapped_pass(self.model, self.cache, slots, [*feeds, *chunks])
        except Exception as error:  # a failed forward ends the answers in it, never the runner
            log.exception("batched pass failed")
            for run in (*runs, *filling):
                self._end(run, error)
            return
        elapsed = time.perf_counter() - started
        for run, chunk in zip(filling, chunks, strict=True):
            keep(self.cache, run.slot, chunk, len(chunk.clean))
            del self._filling[run][: len(chunk.clean)]
            if not self._filling[run]:
                del self._filling[run]
                with self._condition:
                    self._active[run] = run.sequence
        ended: list[tuple[Run, BaseException | None]] = []  # ended after every keep: `_end` may shrink the cache
        for run, sequence, feed, (clean, noisy), rows in zip(runs, sequences, feeds, logits[: len(runs)],
                                                             tapped[: len(runs)], strict=True):
            try:
                if rows is not None and isinstance(sequence, ReadsTaps):
                    sequence.take_taps(rows)
                refinement, kept = sequence.consume(clean, noisy, elapsed, run.cancelled())
            except Exception as error:  # one answer's decoding failed: the others in the pass go on
                log.exception("decoding step failed")
                ended.append((run, error))
                continue
            keep(self.cache, run.slot, feed, kept)
            run.passes += 1
            run._out.put(refinement)
            if refinement.done:
                ended.append((run, None))
        for run, error in ended:
            self._end(run, error)

    @contextlib.contextmanager
    def _team(self, runs: list[Run], sequences: list[DecodingSequence]) -> Iterator[None]:
        """The pass's threads: `lead_threads` while it makes some answer's lead and those cores are spare
        (`SpareCores`: nothing but this turn's own work ran on them just before), else torch's (one a core the LM is
        given: voice/engines.py). On the 2-core EPYC a lone row takes 7.4 ms on two threads against 12.5 on one, and
        heard voice-to-voice fell by a median 11 ms a turn (scripts/heard_latency.py, 2 x 30 held-out turns, paired);
        with another process on the second core a two-thread team waits at every step, hence the check. A wider pass
        is not one the draft policy may time (`TimesItsPasses`): its costs are those of the usual team. Every pass is
        handed over to what follows (the next pass, or the first phrase's render that the passes stand aside for)."""
        gauge = SpareCores.running()
        if gauge is None:  # no voice served here (voice/engines.py starts it): no lead to hurry, no render to hand to
            yield
            return
        threads = team = torch.get_num_threads()
        wide = min(self.lead_threads, usable_cores())
        if wide > threads and any(run.passes < run.lead for run in runs) and gauge.allows(wide):
            team = wide
            for sequence in sequences:
                if isinstance(sequence, TimesItsPasses):
                    sequence.untimed()
        with torch_threads(team), SpareCores.handing_over(team):
            yield

    def _end(self, run: Run, error: BaseException | None) -> None:
        run.ended = True
        with self._condition:
            self._active.pop(run, None)
            self._filling.pop(run, None)
        # It had a slot (finished, failed, or its prefill failed). Runner thread, between passes, after every keep of
        # the last one: the other slots' lengths are final, so shrinking the buffers keeps all they hold.
        if run.slot is not None:
            self.cache.release(run.slot)
        if error is not None:
            run._out.put(error)
        run._out.put(None)
