"""The one percentile of every report and benchmark, so a "p95" in one JSON file is the same statistic as in another.

The definition is linear interpolation between closest ranks (Hyndman and Fan's type 7, numpy's and R's default):
for n sorted values the q-th percentile sits at rank (n - 1) * q / 100 and between two ranks it is interpolated.
Why this one and not nearest rank: the reports summarise a few dozen turns, where nearest rank jumps from one sample
to the next as q moves and its p50 of an even count is one of the middle two rather than their mean; type 7 is
continuous in q, its p50 is `statistics.median`, and anyone can reproduce a figure with `numpy.percentile`. The
percentile is given as 0..100, as numpy and the field names (p50, p90, p95) do.

No values is an error, not a number: a report must say "not measured" itself (`percentile_or`), never print a NaN
it took for a latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

Default = TypeVar("Default", float, None)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `values` by linear interpolation between closest ranks (numpy's default), so
    the p50 of an even count is the mean of the middle two. Raises ValueError for no values or q out of range."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentile_or(values: Sequence[float], q: float, default: Default) -> float | Default:
    """`percentile`, or `default` when there are no values: None where a report's field may be absent, NaN where a
    benchmark's JSON row always carries a number."""
    return percentile(values, q) if values else default


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """The area under the ROC curve of a score: the chance that a positive scores above a negative, ties counting
    half (the separation, whatever the threshold), to three decimals."""
    if not positives or not negatives:
        raise ValueError("the AUC needs a positive and a negative")
    wins = sum((a > b) + 0.5 * (a == b) for a in positives for b in negatives)
    return round(wins / (len(positives) * len(negatives)), 3)
