"""The row counts, drafting rows and thread counts that a kernel's exactness tests sweep."""

from __future__ import annotations

from collections.abc import Iterator

from model.process.threads import torch_threads


def rows_and_coarse(row_counts: tuple[int, ...] = (1, 2, 3, 9)) -> Iterator[tuple[int, int]]:
    """(rows, coarse) for each row count and a spread of first drafting rows (none, one, half, all), under 1 and then
    2 threads; the caller's thread count is restored afterwards (also when the caller stops early)."""
    for count in (1, 2):
        with torch_threads(count):
            for rows in row_counts:
                for coarse in sorted({0, 1, rows // 2, rows}):
                    yield rows, coarse
