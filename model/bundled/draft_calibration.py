"""What each self-speculative draft layout costs on this machine, timed once when the model loads and kept on disk.

The draft policy (model/decoding/draft_policy.py) picks the layout with the most expected tokens per ms, so it needs
each layout's cost. Learnt from live passes alone, a process's first answers draft to time every layout (a drafting
pass costs 1.4-3x a lone step with the int4 kernels), and layouts timed minutes apart are compared under different
loads. Calibration answers a few fixed prompts through the model's own runner with the policy's interleaved
schedule (`DraftPolicy.calibrate`): every layout timed in turn, round after round, so the costs are paired. The result
is stored per machine and configuration (`key`: the CPU, thread count, kernels, weights) and seeds later processes
(`DraftPolicy.seed`); live timings keep refining it as the load changes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from model.bundled.backend import BlockDiffusionBackend
from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel

# Answers long enough to run the schedule; none of the benchmarks' held-out prompts
PROMPTS = (
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain in detail how bread is made, step by step.",
    "Describe a walk through a forest in autumn.",
)
MAX_TOKENS = 96


def calibrate_drafts(
    chat: DiffusionChatModel, backend: BlockDiffusionBackend, store: Path, key: str, prompts: Sequence[str] = PROMPTS
) -> list[float] | None:
    """Seed the draft policy of `chat` (whose back end is `backend`) with the costs stored under `key` in `store`
    (a JSON file), or measure and store them. Returns the costs in ms per layout (masks 0, 1, ...), or None when the
    model has no adaptive draft policy (nothing to calibrate) or its answers ended before every layout was timed (the
    policy then learns live)."""
    policy = backend.draft_policy(chat.sampler)
    if policy is None:
        return None
    stored = _read(store)
    costs = stored.get(key)
    if isinstance(costs, list) and len(costs) == policy.max_masks + 1 and all(
        isinstance(cost, (int, float)) and cost > 0 for cost in costs
    ):
        policy.seed([float(cost) for cost in costs])
        return [float(cost) for cost in costs]
    policy.calibrate()
    for prompt in [*prompts, *prompts]:  # an answer may end before the schedule does
        if not policy.calibrating:
            break
        for _draft in chat.stream_chat([ChatMessage("user", prompt)], GenerationOptions(max_new_tokens=MAX_TOKENS)):
            if not policy.calibrating:  # the rest of the answer would time nothing
                break
    measured = policy.costs()
    if any(cost is None for cost in measured):
        return None
    found = [round(float(cost), 3) for cost in measured if cost is not None]
    stored[key] = found
    _write(store, stored)
    return found


def _read(store: Path) -> dict[str, object]:
    try:
        data = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(store: Path, data: dict[str, object]) -> None:
    """Atomically, so that two processes calibrating at once leave one whole file."""
    store.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=store.parent, prefix=store.name, suffix=".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, sort_keys=True)
    os.replace(temporary, store)
