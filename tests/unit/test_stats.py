"""The one percentile of the reports (report_lib/stats.py): numpy's linear interpolation, 0..100, no values an error."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scripts.report_lib.stats import auc, percentile, percentile_or

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=40), st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_of_even_count_is_mean_of_middle_two() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([7.0], 95) == 7.0


def test_percentile_rejects_nothing_and_bad_q() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="0, 100"):
        percentile([1.0], 101)


def test_the_median_is_the_50th_percentile() -> None:
    """Scripts that print a median (statistics.median) report the same statistic as a p50."""
    values = [5.0, 1.0, 9.0, 2.0, 7.0, 3.0]
    assert percentile(values, 50) == statistics.median(values) == 4.0


def test_percentile_or_says_not_measured_without_values() -> None:
    assert percentile_or([], 95, None) is None
    assert math.isnan(percentile_or([], 95, math.nan))
    assert percentile_or([1.0, 3.0], 50, None) == 2.0


def test_auc_is_the_chance_a_positive_outscores_a_negative_ties_counting_half() -> None:
    assert auc([0.9, 0.8], [0.1, 0.8]) == 0.875  # 0.9 beats both, 0.8 beats 0.1 and ties 0.8
    assert auc([1.0], [0.0]) == 1.0 and auc([0.0], [1.0]) == 0.0
    with pytest.raises(ValueError):
        auc([], [0.5])
