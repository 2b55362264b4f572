"""How many tokens a self-speculative pass drafts ahead on this machine: the layout that maximises tokens per ms.

A drafting pass with m masks per block verifies m drafts (`1 + m` clean rows) and drafts a block of m masks after
each of the `m + 1` prefixes it may accept (`m (m + 1)` mask rows). It yields `1 + E[accepted]` tokens, where
E[accepted] = sum over i <= m of P(the first i drafts are accepted), and costs what a pass of that shape costs on this
CPU. Both sides are machine- and model-dependent (with the int4 kernels a 4-row pass, one draft, costs about 1.4-1.7x
a lone row; drafts that are right half the time barely pay for it), so the policy measures both as it decodes, no-I/O:
acceptance per draft position from every pass (starting from the bundled adapter's measured rates), and each layout's
cost from the lone steps it times (the pass and the decoding work around it, from one step's end to the next). It
picks the layout with the most expected tokens per ms, m = 0 (autoregressive) included, drafting only for a clear gain
(`DRAFT_MARGIN`). Every layout gives the teacher's answer exactly; only the speed depends on the choice.

A cost is kept as a ratio, the layout's *shape*: what its step costs against a lone step (layout 0) timed next to it.
The layout in use is timed on every lone pass and the others only now and then, so absolute costs timed minutes
apart compare two loads of a shared machine (one process's other work doubles a step on 2 cores): a seeded drafting
cost then looked cheap beside a no-draft cost timed under load, and handed passes to drafting. A shape is measured
only in pairs: each timed pass of a layout that has just run after another (a calibration round, a re-timing run of a
few passes) is divided by the other layouts' steps of the last few passes, brought to lone-step units by their own
shapes. The load (`scale`: a lone step's ms now, the median of the last passes timed, each divided by its shape) only
turns shapes back into ms; the choice depends on shapes and acceptance alone.

`calibrate` makes the next passes follow a schedule that times every layout in turn, a few passes each, round after
round; an unseeded policy runs rounds of it until every layout is judged. `costs` / `seed` carry the result from one
process to the next (the model's loader keeps it on disk per machine, model/chat/draft_calibration.py), so a process
does not spend its first answers drafting to learn what the last one knew.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from dataclasses import dataclass, field

# P(draft i is accepted | drafts before it were), the bundled adapter's rates (MODEL_CARD.md: 0.46 / 0.25 / 0.17 for
# the first one, two, three drafts), as pseudo-counts that real passes soon outweigh
PRIOR_ACCEPTANCE = (0.46, 0.54, 0.68)
PRIOR_WEIGHT = 20.0
SAMPLES_BEFORE_JUDGING = 2  # paired samples of a layout's cost before it is judged (a shape's first timing, which
# also built its kernels, is not one)
# A shape (or the load) is the median of its last samples: a pass slowed by a moment of other load (2x on a shared
# 2-core machine) must not make the cheapest layout look dear and hand the choice to a dearer one until it is re-timed
COST_WINDOW = 9
# A layout's timing pairs with the other layouts' steps of this many passes before it: those of the run just before
# its own (a step after a layout change is not in its steady shape, so a run's first pass is often not timed)
PAIRED_WITHIN = 6
# Re-timing: while the choice stands, now and then the contender timed longest ago runs for a few passes: a layout
# whose expected tokens per ms are within RETIME_MARGIN of the best's, which a change of acceptance or of the machine
# could make the best. Each re-timing run that leaves the choice as it was doubles the wait before the next, from
# RETIME_EVERY choices up to RETIME_EVERY_MAX; a new choice starts over at RETIME_EVERY. Every RETIME_ALL_OF-th
# re-timing may pick any layout, however dear. Where no drafting layout pays, re-timing runs are most of the passes
# that draft, so their number must grow with the log of the passes, not with the passes.
RETIME_EVERY = 64
RETIME_EVERY_MAX = 2048
RETIME_MARGIN = 0.8
RETIME_ALL_OF = 4
# Drafting must promise this much more than autoregressive passes to be chosen: paired costs still differ by 5-10 %
# from one calibration to the next on a shared machine, and draft layouts chosen on that noise made self-speculative
# decoding 0.93x autoregressive with a 10 % margin (eval_default_model, int4 kernels, 120 prompts)
DRAFT_MARGIN = 0.2
# A voice answer's first phrase is drafted whatever `choose` says (`draft_lead`) only where a draft row is nearly free:
# where one draft a pass costs at most this many lone steps (rows that share one weight read: a GPU, matrix units).
# On the 2-core AVX2 EPYC (one draft 1.7x a lone step) drafting the first phrase of 60 held-out voice turns made it
# commit 84 ms later (p50) and saved 17 ms of speech a turn: heard voice-to-voice p50 899 ms, against 840 without it.
LEAD_MAX_SHAPE = 1.3

# The calibration schedule: this many rounds over every layout, each layout a run of passes in a row (the first pass
# after a layout change is not in its steady shape, so it is not timed); a re-timing is one such run
CALIBRATION_ROUNDS = 5
CALIBRATION_RUN = 3


@dataclass(slots=True)
class _Layout:
    shape: float = 1.0  # its step's cost in lone steps (layout 0's shape is 1 by definition)
    samples: int = 0  # paired samples of its cost so far (layout 0: its timed steps)
    timings: int = 0  # lone steps of it timed, the first (kernel-building) one included
    timed_at: int = 0  # the choice count when it was last timed
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))  # its last shape samples


@dataclass(slots=True)
class DraftPolicy:
    """Chooses masks per block in [0, max_masks] for lone self-speculative passes; `observe` after each pass."""

    max_masks: int
    # P(draft i accepted | the drafts before it were) before any pass: the drafts' measured rates (a drafter's
    # drafter.json), else the bundled adapter's
    prior: tuple[float, ...] = PRIOR_ACCEPTANCE
    tried: list[float] = field(default_factory=list)  # per draft position: passes that verified it
    accepted: list[float] = field(default_factory=list)  # ... and accepted it
    layouts: list[_Layout] = field(default_factory=list)
    choices: int = 0
    # (layout, its step in lone-step ms, the choice count) of the last timed passes: the load, and what a layout's
    # timing is paired with
    steps: deque[tuple[int, float, int]] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    _schedule: deque[int] = field(default_factory=deque)  # layouts the next passes use (a calibration, a re-timing)
    _best: int | None = None  # the layout chosen while the schedule is empty
    _retime_wait: int = RETIME_EVERY  # choices from one re-timing to the next while `_best` stands
    _next_retime: int = RETIME_EVERY  # the choice count of the next re-timing
    _retimes: int = 0  # re-timings so far
    _calibrating: int = 0  # passes of the schedule that belong to `calibrate`
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.max_masks < 1:
            raise ValueError(f"max_masks must be at least 1, got {self.max_masks}")
        for i in range(self.max_masks):
            prior = self.prior[min(i, len(self.prior) - 1)]
            self.tried.append(PRIOR_WEIGHT)
            self.accepted.append(PRIOR_WEIGHT * prior)
        self.layouts = [_Layout() for _ in range(self.max_masks + 1)]

    def acceptance(self) -> list[float]:
        """P(draft i accepted | the drafts before it were), for i in [0, max_masks)."""
        return [a / t for a, t in zip(self.accepted, self.tried, strict=True)]

    def expected_tokens(self, masks: int) -> float:
        """Tokens a pass yields in the steady state of `masks` drafts a pass: the bonus token plus accepted drafts."""
        total, run = 1.0, 1.0
        for p in self.acceptance()[:masks]:
            run *= p
            total += run
        return total

    @property
    def calibrating(self) -> bool:
        return self._calibrating > 0

    def calibrate(self) -> None:
        """Time every layout, interleaved, over the next lone passes (`CALIBRATION_ROUNDS` rounds of
        `CALIBRATION_RUN` passes per layout), whatever the costs known so far."""
        with self._lock:
            self._schedule = deque(self._round() * CALIBRATION_ROUNDS)
            self._calibrating = len(self._schedule)

    def costs(self) -> list[float | None]:
        """Each layout's cost in ms at the present load (None until it has been judged), to the microsecond: the
        precision the calibration stores them at, so costs a policy was seeded with read back as they were stored
        (a shape times the lone step's cost is the seeded cost only up to float rounding)."""
        with self._lock:
            scale = self._scale()
            return [
                round(layout.shape * scale, 3) if scale is not None and self._judged(layout) else None
                for layout in self.layouts
            ]

    def seed(self, costs: list[float]) -> None:
        """Start from costs an earlier calibration measured (`costs`), as if each layout had been timed: no pass
        drafts only to learn them. Live timings then take over as they would from timed passes."""
        if len(costs) != len(self.layouts) or not all(cost > 0 for cost in costs):
            raise ValueError(f"{len(self.layouts)} positive costs needed, got {costs}")
        with self._lock:
            for m, (layout, cost) in enumerate(zip(self.layouts, costs, strict=True)):
                layout.shape = cost / costs[0]
                layout.recent.clear()
                if m:
                    layout.recent.extend([layout.shape] * SAMPLES_BEFORE_JUDGING)
                layout.samples, layout.timings, layout.timed_at = SAMPLES_BEFORE_JUDGING, 1, self.choices
            self.steps.clear()
            self.steps.extend([(0, costs[0], self.choices)] * SAMPLES_BEFORE_JUDGING)

    def lead_pays(self) -> bool:
        """Whether drafting a voice answer's lead pays for its rows here: one draft a pass has been judged to cost at
        most `LEAD_MAX_SHAPE` lone steps (see there). False until it is judged."""
        with self._lock:
            layout = self.layouts[1]
            return self._judged(layout) and layout.shape <= LEAD_MAX_SHAPE

    def choose(self) -> int:
        """Masks per block for the next lone pass."""
        with self._lock:
            self.choices += 1
            if not self._schedule and not all(self._judged(layout) for layout in self.layouts):
                self._schedule.extend(self._round())  # unseeded: time every layout in turn until each is judged
            if not self._schedule:
                rates = [self.expected_tokens(m) / layout.shape for m, layout in enumerate(self.layouts)]
                best = max(range(len(self.layouts)), key=lambda m: rates[m])
                best = best if rates[best] > (1 + DRAFT_MARGIN) * rates[0] else 0
                if best != self._best:  # a new choice: its contenders are re-timed soon again
                    self._best, self._retime_wait = best, RETIME_EVERY
                    self._next_retime = self.choices + RETIME_EVERY
                if self.choices < self._next_retime:
                    return best
                self._retimes += 1
                if self._retimes % RETIME_ALL_OF == 0:
                    self._retime(range(len(self.layouts)))
                else:
                    self._retime([m for m, rate in enumerate(rates) if rate >= RETIME_MARGIN * max(rates)])
                self._retime_wait = min(2 * self._retime_wait, RETIME_EVERY_MAX)
                self._next_retime = self.choices + self._retime_wait
            self._calibrating = max(0, self._calibrating - 1)
            return self._schedule.popleft()

    def observe(self, masks: int, drafted: int, accepted: int, pass_ms: float | None) -> None:
        """A pass verified `drafted` drafts and accepted `accepted` of them. `pass_ms`: its time when it was a lone
        pass in the steady layout of `masks` (`drafted == masks`), else None (a batched pass, a first pass with a
        folded prompt, or one after a layout change: their cost says nothing about the layout)."""
        with self._lock:
            for i in range(min(drafted, accepted + 1, self.max_masks)):
                self.tried[i] += 1
                self.accepted[i] += i < accepted
            if pass_ms is None or not 0 <= masks <= self.max_masks:
                return
            layout = self.layouts[masks]
            if layout.timings > 0:  # the first timing of a shape also built its kernels: not counted
                if masks == 0:
                    layout.samples += 1
                else:
                    nearby = [ms for m, ms, at in self.steps if m != masks and at >= self.choices - PAIRED_WITHIN]
                    if nearby:
                        layout.recent.append(pass_ms / statistics.median(nearby))
                        layout.shape = statistics.median(layout.recent)
                        layout.samples += 1
                if masks == 0 or layout.samples:
                    self.steps.append((masks, pass_ms / layout.shape, self.choices))
            layout.timings += 1
            layout.timed_at = self.choices

    def _round(self) -> list[int]:
        return [m for m in range(self.max_masks + 1) for _ in range(CALIBRATION_RUN)]

    def _retime(self, candidates: range | list[int]) -> None:
        """Run the candidate timed longest ago for a few passes."""
        layout = min(candidates, key=lambda m: self.layouts[m].timed_at)
        self._schedule.extend([layout] * CALIBRATION_RUN)

    def _judged(self, layout: _Layout) -> bool:
        return layout.samples >= SAMPLES_BEFORE_JUDGING

    def _scale(self) -> float | None:
        """A lone step's ms at the present load (None before any timed step)."""
        return statistics.median(ms for _, ms, _ in self.steps) if self.steps else None
