"""Time to the first draft, turn by turn, in a growing conversation: the LM's cache kept between answers vs not.

    python scripts/bench/bench_conversation.py [--turns 8] [--rounds 2] [--json artifacts/bench_conversation.json]

A voice conversation re-sends the system prompt and the whole history every turn. The bundled model keeps its KV
cache after an answer and encodes only the part of the next prompt it does not already hold; this measures what that
saves as the history grows (the same held-out prompts, the bundled model, greedy). Figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from model.bundled.default_model import load_default_chat_model
from model.chat import ChatMessage, GenerationOptions
from voice.think.spoken import SPOKEN_RULES, SPOKEN_SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = ROOT / "tests" / "data" / "heldout_prompts.txt"


def conversation(lm: Any, prompts: list[str], max_new_tokens: int) -> list[dict[str, float]]:
    """One conversation; per turn: prompt tokens, tokens found in the cache, ms to the first draft."""
    history = [ChatMessage("system", SPOKEN_SYSTEM_PROMPT)]
    turns = []
    for prompt in prompts:
        history.append(ChatMessage("user", prompt))
        started = time.perf_counter()
        drafts = lm.stream_chat(history, GenerationOptions(max_new_tokens=max_new_tokens, seed=0, rules=SPOKEN_RULES))
        next(drafts)
        first_ms = (time.perf_counter() - started) * 1000
        *_, last = drafts
        turns.append({"prompt_tokens": last.prompt_tokens, "reused_tokens": last.cached_prompt_tokens,
                      "first_draft_ms": round(first_ms, 1)})
        history.append(ChatMessage("assistant", last.text))
    return turns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="conversations per setting (alternating settings)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    prompts = PROMPTS.read_text(encoding="utf-8").splitlines()[: args.turns]
    lm = load_default_chat_model()
    runs: dict[str, list[list[dict[str, float]]]] = {"kept": [], "dropped": []}
    conversation(lm, prompts[:2], args.max_new_tokens)  # warm-up
    for _ in range(args.rounds):
        for setting in ("dropped", "kept"):
            lm.backend.runner.reuse_prompt_cache = setting == "kept"
            runs[setting].append(conversation(lm, prompts, args.max_new_tokens))
    print("| turn | prompt tokens | first draft, cache dropped (ms) | first draft, cache kept (ms) | tokens reused |")
    print("|---|---|---|---|---|")
    rows = []
    for i in range(args.turns):
        dropped = statistics.median(run[i]["first_draft_ms"] for run in runs["dropped"])
        kept = statistics.median(run[i]["first_draft_ms"] for run in runs["kept"])
        tokens, reused = runs["kept"][0][i]["prompt_tokens"], runs["kept"][0][i]["reused_tokens"]
        rows.append({"turn": i + 1, "prompt_tokens": tokens, "dropped_ms": dropped, "kept_ms": kept, "reused": reused})
        print(f"| {i + 1} | {tokens} | {dropped:.0f} | {kept:.0f} | {reused} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": "python scripts/bench/bench_conversation.py " + " ".join(
            sys.argv[1:] if argv is None else argv), "rows": rows, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
