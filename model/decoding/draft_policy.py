"""How many tokens a self-speculative pass drafts ahead on this machine: the layout that maximises tokens per ms.

A drafting pass with m masks per block verifies m drafts (`1 + m` clean rows) and drafts a block of m masks after
each of the `m + 1` prefixes it may accept (`m (m + 1)` mask rows). It yields `1 + E[accepted]` tokens, where
E[accepted] = sum over i <= m of P(the first i drafts are accepted), and costs what a pass of that shape costs on this
CPU. Both sides are machine- and model-dependent (with the int4 kernels a 4-row pass, one draft, costs about 1.4-1.7x
a lone row; drafts that are right half the time barely pay for it), so the policy measures both as it decodes, no-I/O:
costs per layout from the lone steps it times (the pass and the decoding work around it, from one step's end to the
next; each layout is tried a few times before it is judged, its cost the median of its last timings, and re-timed now
and then as the machine's load changes: often when it comes close to the best, rarely when it is far behind),
acceptance per draft position from every pass (starting from the bundled adapter's measured rates), and picks the
layout with the most expected tokens per ms, m = 0 (autoregressive) included, drafting only for a clear gain
(`DRAFT_MARGIN`). Every layout gives the teacher's answer exactly; only the speed depends on the choice.

Costs timed minutes apart differ with the machine's load alone, so the first judgement is made on paired timings:
`calibrate` makes the next passes follow a schedule that times every layout in turn, a few passes each, round after
round, and `costs` / `seed` carry the result from one process to the next (the model's loader keeps it on disk per
machine, model/chat/draft_calibration.py), so a process does not spend its first answers drafting to learn
what the last one knew.
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
TIMINGS_BEFORE_JUDGING = 3  # lone passes timed per layout before its cost is trusted (the first one is not counted)
# A layout's cost is the median of its last timings: a pass slowed by a moment of other load (2x on a shared 2-core
# machine) must not make the cheapest layout look dear and hand the choice to a dearer one until it is re-timed
COST_WINDOW = 9
# Every so many choices, the contender timed longest ago is used once more: a layout whose expected tokens per ms are
# within RETIME_MARGIN of the best's, which a change of load could make the best. The others are re-timed only every
# RETIME_ALL_EVERY choices: a pass of a layout 3x dearer than the best every 32 passes cost self-speculative decoding
# 6 % of its speed.
RETIME_EVERY = 64
RETIME_MARGIN = 0.8
RETIME_ALL_EVERY = 512
# Drafting must promise this much more than autoregressive passes to be chosen: on a shared machine two layouts' costs,
# timed minutes apart, differ by 10-30 % with the load alone, and draft layouts chosen on that noise made
# self-speculative decoding 0.93x autoregressive with a 10 % margin (eval_default_model, int4 kernels, 120 prompts)
DRAFT_MARGIN = 0.2
# The calibration schedule: this many rounds over every layout, each layout a run of passes in a row (the first pass
# after a layout change is not in its steady shape, so it is not timed)
CALIBRATION_ROUNDS = 5
CALIBRATION_RUN = 3


@dataclass(slots=True)
class _Layout:
    cost_ms: float = 0.0
    timings: int = 0
    timed_at: int = 0  # the choice count when it was last timed
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))


@dataclass(slots=True)
class DraftPolicy:
    """Chooses masks per block in [0, max_masks] for lone self-speculative passes; `observe` after each pass."""

    max_masks: int
    tried: list[float] = field(default_factory=list)  # per draft position: passes that verified it
    accepted: list[float] = field(default_factory=list)  # ... and accepted it
    layouts: list[_Layout] = field(default_factory=list)
    choices: int = 0
    _schedule: deque[int] = field(default_factory=deque)  # layouts the next passes use, while calibrating
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.max_masks < 1:
            raise ValueError(f"max_masks must be at least 1, got {self.max_masks}")
        for i in range(self.max_masks):
            prior = PRIOR_ACCEPTANCE[min(i, len(PRIOR_ACCEPTANCE) - 1)]
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
        return bool(self._schedule)

    def calibrate(self) -> None:
        """Time every layout, interleaved, over the next lone passes (`CALIBRATION_ROUNDS` rounds of
        `CALIBRATION_RUN` passes per layout), whatever the costs known so far."""
        with self._lock:
            runs = [m for m in range(self.max_masks + 1) for _ in range(CALIBRATION_RUN)]
            self._schedule = deque(runs * CALIBRATION_ROUNDS)

    def costs(self) -> list[float | None]:
        """Each layout's cost in ms (None until it has been timed enough to be judged)."""
        with self._lock:
            return [layout.cost_ms if layout.timings >= TIMINGS_BEFORE_JUDGING else None for layout in self.layouts]

    def seed(self, costs: list[float]) -> None:
        """Start from costs an earlier calibration measured (`costs`), as if each layout had been timed: no pass
        drafts only to learn them. Live timings then take over as they would from timed passes."""
        if len(costs) != len(self.layouts) or not all(cost > 0 for cost in costs):
            raise ValueError(f"{len(self.layouts)} positive costs needed, got {costs}")
        with self._lock:
            for layout, cost in zip(self.layouts, costs, strict=True):
                layout.recent.clear()
                layout.recent.extend([cost] * TIMINGS_BEFORE_JUDGING)
                layout.cost_ms, layout.timings, layout.timed_at = cost, TIMINGS_BEFORE_JUDGING, self.choices

    def choose(self) -> int:
        """Masks per block for the next lone pass."""
        with self._lock:
            self.choices += 1
            if self._schedule:
                return self._schedule.popleft()
            untimed = [m for m, layout in enumerate(self.layouts) if layout.timings < TIMINGS_BEFORE_JUDGING]
            if untimed:  # the most drafts first: a process's first answers draft as a fixed layout would
                return untimed[-1]
            rates = [self.expected_tokens(m) / layout.cost_ms for m, layout in enumerate(self.layouts)]
            if self.choices % RETIME_ALL_EVERY == 0:
                return min(range(len(self.layouts)), key=lambda m: self.layouts[m].timed_at)
            if self.choices % RETIME_EVERY == 0:
                contenders = [m for m, rate in enumerate(rates) if rate >= RETIME_MARGIN * max(rates)]
                return min(contenders, key=lambda m: self.layouts[m].timed_at)
            best = max(range(len(self.layouts)), key=lambda m: rates[m])
            return best if rates[best] > (1 + DRAFT_MARGIN) * rates[0] else 0

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
                layout.recent.append(pass_ms)
                layout.cost_ms = statistics.median(layout.recent)
            layout.timings += 1
            layout.timed_at = self.choices
