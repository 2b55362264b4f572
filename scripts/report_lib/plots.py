"""The report's pictures: where each turn's time went (stacked timeline) and how voice-to-voice latency is spread.

Each run (a configuration: speculation and early LM start on or off) is one panel or one column, side by side, so a
comparison reads at a glance. Matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use(): the backend must be chosen before pyplot loads
import numpy as np

from scripts.report_lib.report_math import SEGMENTS

COLOURS = ("#9aa5b1", "#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756")
Run = Mapping[str, Any]  # {"name": str, "turns": [turn records]}


def _label(turn: Mapping[str, Any]) -> str:
    """What the user said (short), else the file name: synthesised clips are named by a hash."""
    heard = str(turn.get("transcript") or "").strip()
    text = heard if heard else Path(str(turn["source"])).stem
    return f"{turn['index']}: {text[:26]}{'…' if len(text) > 26 else ''}"


def plot_timeline(runs: Sequence[Run], path: Path) -> Path:
    """Horizontal stacked bars, one per turn: each critical-path segment from speech end to first audio out."""
    columns = min(2, len(runs))
    rows_of_panels = math.ceil(len(runs) / columns)
    height = max(3.2, 0.32 * max(len(run["turns"]) for run in runs) + 1.6) * rows_of_panels + 0.6
    figure, axes = plt.subplots(rows_of_panels, columns, figsize=(7.5 * columns, height), sharex=True, squeeze=False)
    panels = axes.flatten()
    for axis in panels[len(runs) :]:
        axis.set_visible(False)
    for axis, run in zip(panels, runs, strict=False):
        turns = list(run["turns"])
        rows = np.arange(len(turns))
        left = np.zeros(len(turns))
        for (key, label), colour in zip(SEGMENTS, COLOURS, strict=True):
            widths = np.array([(turn["segments_ms"] or {}).get(key, 0.0) for turn in turns])
            axis.barh(rows, widths, left=left, color=colour, label=label, height=0.7)
            left += widths
        for row, turn in enumerate(turns):
            if turn["segments_ms"] is None:
                axis.text(0, row, "  no audio (see errors)", va="center", fontsize=8, color="#c00")
        axis.set_yticks(rows, [_label(turn) for turn in turns], fontsize=8)
        axis.invert_yaxis()
        axis.set_xlabel("ms after the user stopped speaking")
        axis.set_title(str(run["name"]))
        axis.grid(axis="x", alpha=0.3)
    handles, labels = panels[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(SEGMENTS), fontsize=8, frameon=False)
    figure.suptitle("Voice-to-voice latency by stage, per turn (critical path)")
    figure.tight_layout(rect=(0, 0.6 / height, 1, 1))
    return _save(figure, path)


def plot_distribution(runs: Sequence[Run], path: Path) -> Path:
    """Box plot with every turn as a dot, per run: the spread of voice-to-voice latency."""
    figure, axis = plt.subplots(figsize=(max(5.0, 2.6 * len(runs) + 2.0), 4.5))
    series = [
        [turn["latency_ms"]["voice_to_voice"] for turn in run["turns"] if turn["latency_ms"]["voice_to_voice"]]
        for run in runs
    ]
    positions = np.arange(1, len(runs) + 1)
    drawn = [values or [np.nan] for values in series]
    axis.boxplot(drawn, positions=positions, widths=0.5, showfliers=False)
    jitter = np.random.default_rng(0)
    for position, values, colour in zip(positions, series, COLOURS[1:], strict=False):
        xs = position + jitter.uniform(-0.15, 0.15, len(values))
        axis.scatter(xs, values, s=18, alpha=0.75, color=colour, zorder=3)
    axis.set_xticks(positions, [str(run["name"]) for run in runs], fontsize=9)
    axis.set_ylabel("voice-to-voice latency (ms)")
    highest = max((max(values) for values in series if values), default=1.0)
    axis.set_ylim(0, highest * 1.12)
    axis.set_title("Distribution of voice-to-voice latency")
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return _save(figure, path)


def _save(figure: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
