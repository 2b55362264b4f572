"""What a `response_format` costs the bundled model, and how often its answers are valid.

    python scripts/bench/bench_structured.py --prompts 10 --max-tokens 64 [--decoding diffusion ...] [--strict]

For each decoding mode (self-speculative, autoregressive and diffusion by default), every held-out prompt is answered
free and constrained by a small JSON schema, through the engine (`DiffusionChatModel.stream_chat`, the batch runner,
one answer at a time).
Printed per mode: tokens/s of each, the constrained answers' validity (JSON that the schema's pydantic model accepts),
finish reasons, tokens a pass, and the grammar's own work (masks and tentative advances of verification rows, drafts
and diffusion proposals, timed where the step object calls it: the part of the constrained time that is not the
network's). `--strict`: the schema as the official client's `parse` sends it (no properties beyond the model's), where
the default schema, pydantic's own, lets an answer add properties. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.decoding import sampler
from model.decoding.grammar import compile_format, response_format
from model.loading import load_chat_model
from model.process import watch

PROMPTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "heldout_prompts.txt"


class Reply(BaseModel):
    answer: str = Field(max_length=60)
    happy: bool


def answer(chat: DiffusionChatModel, prompt: str, options: GenerationOptions
           ) -> tuple[list[int], str, str, float, int]:
    """(tokens, text, finish reason, seconds, passes) of one answer."""
    start = time.perf_counter()
    last = None
    for draft in chat.stream_chat([ChatMessage("user", prompt)], options):
        last = draft
    seconds = time.perf_counter() - start
    assert last is not None and last.refinement is not None
    eos = last.refinement.eos_ids
    tokens = [token for token in last.refinement.tokens[: last.completion_tokens] if token not in eos]
    return tokens, last.text, last.finish_reason or "", seconds, last.step + 1


class GrammarClock:
    """Time spent in the step objects' grammar work (verification rows, drafts, proposals), from the spans
    model/decoding/speculative.py and model/decoding/sampler.py mark around it (model/process/watch.py): the part of
    a constrained answer that is not the network's. Counts while its `watching()` block runs."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def _seen(self, span: watch.Span) -> None:
        if span.kind == watch.GRAMMAR:
            self.seconds += (span.end_ns - span.start_ns) / 1e9

    def watching(self) -> contextlib.AbstractContextManager[None]:
        return watch.watching(self._seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--decoding", action="append", choices=sampler.DECODING_MODES,
                        help="a decoding mode to measure (repeatable; default: all three)")
    parser.add_argument("--strict", action="store_true",
                        help="no additional properties, as the official client's parse asks")
    args = parser.parse_args()
    prompts = PROMPTS.read_text(encoding="utf-8").splitlines()[: args.prompts]
    bundled = load_chat_model(None)
    assert isinstance(bundled, DiffusionChatModel)
    schema = Reply.model_json_schema()
    fmt = response_format("json_schema", {**schema, "additionalProperties": False} if args.strict else schema, "Reply")
    compile_format(fmt)
    clock = GrammarClock()
    with clock.watching():
        for decoding in args.decoding or sampler.DECODING_MODES:
            config = dataclasses.replace(bundled.sampler, decoding=decoding)
            chat = DiffusionChatModel(bundled.name, bundled.tokenizer, bundled.backend, config, bundled.system_prompt,
                                      bundled.context_length)
            free = GenerationOptions(max_new_tokens=args.max_tokens)
            constrained = dataclasses.replace(free, response_format=fmt)
            answer(chat, prompts[0], constrained)  # warm: the grammar tokenizer is built by the first constrained one
            totals = {"free": [0, 0.0], "constrained": [0, 0.0]}
            passes = {"free": 0, "constrained": 0}
            valid, finishes = 0, []
            clock.seconds = 0.0
            for prompt in prompts:
                for label, options in (("free", free), ("constrained", constrained)):
                    tokens, text, finish, seconds, steps = answer(chat, prompt, options)
                    totals[label][0] += len(tokens)
                    totals[label][1] += seconds
                    passes[label] += steps
                    if label == "constrained":
                        finishes.append(finish)
                        try:
                            Reply.model_validate(json.loads(text))
                            valid += 1
                        except (json.JSONDecodeError, ValidationError):
                            print(f"  invalid ({finish}): {text!r}")
            rates = {label: count / seconds for label, (count, seconds) in totals.items()}
            print(f"{decoding}: free {rates['free']:.1f} tokens/s ({totals['free'][0]} tokens), constrained "
                  f"{rates['constrained']:.1f} tokens/s ({totals['constrained'][0]} tokens), "
                  f"ratio {rates['constrained'] / rates['free']:.2f}; tokens a pass "
                  f"{totals['free'][0] / passes['free']:.2f} free, "
                  f"{totals['constrained'][0] / passes['constrained']:.2f} "
                  f"constrained; valid {valid}/{len(prompts)}; finishes "
                  f"{ {reason: finishes.count(reason) for reason in set(finishes)} }; grammar "
                  f"{100 * clock.seconds / totals['constrained'][1]:.1f} % of the constrained time "
                  f"({1e3 * clock.seconds / max(totals['constrained'][0], 1):.2f} of "
                  f"{1e3 * totals['constrained'][1] / max(totals['constrained'][0], 1):.1f} ms a token)")


if __name__ == "__main__":
    main()
