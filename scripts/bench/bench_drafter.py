"""What a draft costs beside a pass: the bundled model's (or a GGUF's, with the drafter `dlm adapt --drafter` made for
it) pass of 1-5 clean rows of one answer, plain and with the drafter's taps, and one drafting call of its drafter (two
new context rows, the block), through the decode kernel and in torch. Medians of `--rounds` rounds, each shape timed
`--passes` times after a warm-up, shapes interleaved.

    python scripts/bench/bench_drafter.py [--threads 2] [--rounds 3] [--json FILE] [--model FILE.gguf [--adapter DIR]]

From these, a pass verifying k drafts costs `pass(k + 1) + drafting call` for `1 + E[accepted]` tokens (drafts
accepted cumulatively as drafter.json's `acceptance` says): the expected speed against a lone step is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from model.bundled.default_model import load_default_chat_model
from model.chat.spec import ModelSpec
from model.decoding.step import Feed
from model.drafting.context import DraftingContext
from model.loading import load_chat_model
from model.process.threads import set_torch_threads
from model.runtime.batching import SlotCache, prefill, tapped_pass

PROMPT = [3 + (7 * i) % 2000 for i in range(106)]  # a 100-token context and up to 6 rows after it


def pass_ms(model, rows: int, taps: tuple[int, ...], passes: int) -> float:  # type: ignore[no-untyped-def]
    cache = SlotCache(1)
    prefill(model, cache, 0, PROMPT[:100])
    feed = Feed(clean=tuple(PROMPT[100 : 100 + rows]), taps=taps)
    for _ in range(3):
        tapped_pass(model, cache, [0], [feed])
    started = time.perf_counter()
    for _ in range(passes):
        tapped_pass(model, cache, [0], [feed])
    return 1e3 * (time.perf_counter() - started) / passes


def drafting_ms(backend, native: bool, calls: int) -> float:  # type: ignore[no-untyped-def]
    drafter = backend.drafter
    shape = drafter.config.target
    context = DraftingContext(drafter, backend.embedded, 99, backend._native_drafter if native else None)
    torch.manual_seed(0)
    rows = [torch.randn(2, len(drafter.config.taps), shape.hidden) for _ in range(calls + 10)]
    context.extend(torch.randn(20, len(drafter.config.taps), shape.hidden))
    for tapped in rows[:10]:
        context.extend(tapped)
        context.draft(5)
    started = time.perf_counter()
    for tapped in rows[10:]:
        context.extend(tapped)
        context.draft(5)
    return 1e3 * (time.perf_counter() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=60)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--model", help="a GGUF with a drafter (default: the bundled model)")
    parser.add_argument("--adapter", help="the GGUF's adapter folder (default: the one beside it)")
    args = parser.parse_args()
    set_torch_threads(args.threads)
    chat = load_default_chat_model() if args.model is None else load_chat_model(
        ModelSpec(source=args.model, adapter=args.adapter))
    backend = chat.backend
    if getattr(backend, "drafter", None) is None:
        raise SystemExit("bench_drafter: the model loaded without a drafter (none made for it, or no decode kernel "
                         "here)")
    taps = backend.drafter.config.taps
    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for rows in range(1, 6):
            samples.setdefault(f"pass {rows}", []).append(pass_ms(backend.model, rows, (), args.passes))
            samples.setdefault(f"tapped {rows}", []).append(pass_ms(backend.model, rows, taps, args.passes))
        samples.setdefault("drafting, kernel", []).append(drafting_ms(backend, True, args.passes))
        samples.setdefault("drafting, torch", []).append(drafting_ms(backend, False, args.passes))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, value in medians.items():
        print(f"{name:18s} {value:6.2f} ms   ({', '.join(f'{v:.2f}' for v in samples[name])})")
    accepted = backend.drafter_acceptance
    lone = medians["tapped 1"]
    for k in range(1, min(len(accepted), 4) + 1):  # a pass of k + 1 rows is timed up to 5
        tokens = 1 + sum(accepted[:k])
        cost = medians[f"tapped {k + 1}"] + medians["drafting, kernel"]
        print(f"verify {k} draft(s): {tokens:.2f} tokens for {cost:.1f} ms = {tokens * lone / cost:.2f}x a lone step")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"samples": samples, "medians": medians, "threads": args.threads}, indent=1))


if __name__ == "__main__":
    main()
