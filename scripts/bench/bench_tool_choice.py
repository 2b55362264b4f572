"""How often the bundled model chooses the right tool for a spoken request, through the voice session's own tool
loop (voice/tools/loop.py: the spoken system prompt with the built-in functions offered, the same constraint).

    python scripts/bench/bench_tool_choice.py [--threads 1] [--json artifacts/bench_tool_choice.json]

Held-out requests in the words Whisper writes for speech, in four kinds: the time, timers, sums, and requests that
need no tool. Each is answered twice, greedily:

* `auto` (what the voice session asks): the answer may be words or one call, the grammar keeps a call well formed.
  Right: the kind's tool is called (`get_time`; `set_timer` or `set_alarm`; `calculate`), or, for a request that
  needs none, no call.
* `required` (diagnostic: a call is forced): which function the model picks when it must call one, and for sums
  whether the call's result is the right number. Requests that need no tool are not asked this way.
* without tools (the spoken system prompt alone): whether the "auto" answer's words are the ones the model says when
  no tool is offered, i.e. what offering the tools changes for a model that does not call them.

SmolLM2-135M-Instruct was not trained for tools: the figures say what it does, not what a tool-capable model
would. Printed per kind; none is used by any test or tuning.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from model.bundled.default_model import load_default_chat_model
from model.chat import ChatMessage, GenerationOptions
from model.chat.tools import constraint
from model.process.threads import set_torch_threads
from voice.errors import ToolError
from voice.think.spoken import spoken_answer
from voice.tools.builtin import BUILTIN_FUNCTIONS, BuiltinTools
from voice.tools.loop import RunTools, ToolLoop
from voice.tools.timers import Timers

REQUESTS: dict[str, tuple[str, ...]] = {
    "time": (
        "What time is it?", "What's the time right now?", "Can you tell me the time?", "What day is it today?",
        "What's today's date?", "Do you know what time it is?", "Is it past noon yet?", "What year is it?",
        "Tell me the current time please.", "What's the date today?",
    ),
    "timer": (
        "Set a timer for five minutes.", "Start a ten minute timer.", "Remind me in thirty seconds.",
        "Set a timer for one hour.", "Can you set a timer for 3 minutes for the eggs?", "Wake me up at 7 30.",
        "Set an alarm for six in the morning.", "Timer for twenty minutes please.",
        "Count down two minutes for me.", "Set a pasta timer for 12 minutes.",
    ),
    "sum": (
        "What is 17 times 23?", "What's 245 plus 378?", "How much is 1000 divided by 8?", "What is 12 squared?",
        "What's 56 minus 19?", "Can you add 33 and 48?", "What is 7 times 8 times 9?", "How much is 15% of 80?",
        "What's 144 divided by 12?", "Multiply 25 by 4.",
    ),
    "none": (
        "Tell me a joke.", "How are you today?", "What's the capital of France?", "Why is the sky blue?",
        "Can you recommend a good book?", "What should I cook for dinner?", "Thanks, that's all.",
        "Who wrote Romeo and Juliet?", "What's your name?", "Say something nice.",
    ),
}
EXPECTED = {"time": {"get_time"}, "timer": {"set_timer", "set_alarm"}, "sum": {"calculate"}, "none": set()}
SUM_VALUES = (391, 623, 125, 144, 37, 81, 504, 12, 12, 100)


FIRST_DRAFT_MS: dict[str, list[float]] = {"tools": [], "plain": []}


def answer(lm, messages: list[ChatMessage], options: GenerationOptions) -> tuple[str, int]:
    """The finished answer's text and its prompt's length in tokens; the time to its first draft is kept by kind."""
    started = time.perf_counter()
    first = True
    for draft in lm.stream_chat(messages, options):
        if first:
            FIRST_DRAFT_MS["plain" if options.tools is None else "tools"].append((time.perf_counter() - started) * 1e3)
            first = False
        if draft.done:
            return draft.text, draft.prompt_tokens
    return "", 0


def chosen(lm, request: str, required: bool) -> tuple[str | None, str, str, int]:
    """(the function called or None, the call's arguments, the answer text, prompt tokens) for one request."""
    loop = ToolLoop([ChatMessage("user", request)], BUILTIN_FUNCTIONS, spoken_answer())
    options = loop.options()
    if required:
        options = dataclasses.replace(options, tools=constraint(BUILTIN_FUNCTIONS, required=True, parallel=False))
    text, prompt_tokens = answer(lm, loop.messages, options)
    decision = loop.answered(text)
    if isinstance(decision, RunTools):
        return decision.calls[0].name, decision.calls[0].arguments, text, prompt_tokens
    return None, "", text, prompt_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    set_torch_threads(args.threads)
    lm = load_default_chat_model()
    tools = BuiltinTools(Timers(time.monotonic))
    cases = [(kind, i, request) for kind, requests in REQUESTS.items() for i, request in enumerate(requests)]
    started = time.monotonic()
    # one mode at a time, so each keeps its system prompt cached from one request to the next, as a session does
    plain = [answer(lm, [ChatMessage("user", request)], spoken_answer()) for _, _, request in cases]
    rows = []
    for (kind, _, request), (plain_text, plain_tokens) in zip(cases, plain, strict=True):
        name, arguments, text, prompt_tokens = chosen(lm, request, required=False)
        rows.append({"kind": kind, "request": request, "auto": name, "auto_arguments": arguments, "auto_text": text,
                     "auto_right": (name in EXPECTED[kind]) if EXPECTED[kind] else name is None,
                     "plain_text": plain_text, "same_as_plain": text == plain_text, "prompt_tokens": prompt_tokens,
                     "plain_prompt_tokens": plain_tokens})
    for (kind, i, request), row in zip(cases, rows, strict=True):
        if EXPECTED[kind]:
            forced, forced_arguments, _, _ = chosen(lm, request, required=True)
            row.update(required=forced, required_arguments=forced_arguments, required_right=forced in EXPECTED[kind])
            if kind == "sum" and forced == "calculate":
                try:
                    value = float(tools.call("calculate", json.loads(forced_arguments)))
                except (ToolError, ValueError, json.JSONDecodeError):
                    value = None
                row["sum_right"] = value is not None and abs(value - SUM_VALUES[i]) < 1e-6
        print(f"{kind:6} auto={row['auto']!s:12} required={row.get('required')!s:12} {request!r} -> "
              f"{row['auto_text'][:70]!r}", flush=True)
    print(f"\n{len(rows)} requests in {time.monotonic() - started:.0f} s, {args.threads} thread(s)")
    print("kind    auto: right tool (or none)   required: right tool   sums: right result   same words as untooled")
    summary = {}
    for kind in REQUESTS:
        mine = [r for r in rows if r["kind"] == kind]
        auto = sum(r["auto_right"] for r in mine)
        required = sum(r.get("required_right", False) for r in mine) if EXPECTED[kind] else None
        sums = sum(r.get("sum_right", False) for r in mine) if kind == "sum" else None
        calls = sum(r["auto"] is not None for r in mine)
        same = sum(r["same_as_plain"] for r in mine)
        summary[kind] = {"n": len(mine), "auto_right": auto, "auto_calls": calls, "required_right": required,
                         "sum_right": sums, "same_as_plain": same}
        print(f"{kind:6}  {auto}/{len(mine)} ({calls} calls)".ljust(38)
              + (f"{required}/{len(mine)}" if required is not None else "-").ljust(23)
              + (f"{sums}/{len(mine)}" if sums is not None else "-").ljust(21) + f"{same}/{len(mine)}")
    print(f"prompt tokens of a one-message chat: {rows[0]['prompt_tokens']} with the tools offered, "
          f"{rows[0]['plain_prompt_tokens']} without")
    first_ms = {kind: statistics.median(values) for kind, values in FIRST_DRAFT_MS.items() if values}
    print("first draft p50 (ms; a mode's system prompt stays cached from one request to the next): "
          + ", ".join(f"{kind} {ms:.0f}" for kind, ms in first_ms.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "first_draft_ms_p50": first_ms, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
