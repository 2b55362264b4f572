"""Tool calls of a user's own GGUF through `dlm-serve --model FILE` with `tool_choice="auto"`, as a new user tries
them: ten spoken-style requests (the time, timers, sums, and two that need no tool) asked with the official
`openai` client, greedily, with the voice session's built-in functions offered (voice/tools/builtin.py).

    python -m scripts.bench.bench_tool_forms --model FILE.gguf [--checkout DIR ...] [--json OUT]   (from the root)

Each `--checkout` (default: this one) serves the same file from its own code (`python -m model.server.cli`, its
folder first on the path), so one run compares a branch with the code before it. Printed per checkout: each
request's outcome (the call, or the first words of the text), the rate of right calls (the kind's tool called, its
arguments on the schema; for a request that needs no tool, no call), and whether the answers of the requests that
need no tool are the same in every checkout. None of it is used by any test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai

from model.chat.tools import tool_object
from scripts.report_lib.local_service import free_port, wait_ready
from voice.tools.builtin import BUILTIN_FUNCTIONS

HERE = Path(__file__).resolve().parents[2]
REQUESTS: tuple[tuple[str, str], ...] = (
    ("What time is it?", "get_time"),
    ("Can you tell me the time?", "get_time"),
    ("What's today's date?", "get_time"),
    ("Set a timer for five minutes.", "set_timer"),
    ("Start a ten minute timer.", "set_timer"),
    ("Set a pasta timer for 12 minutes.", "set_timer"),
    ("What is 17 times 23?", "calculate"),
    ("What's 245 plus 378?", "calculate"),
    ("Tell me a joke.", ""),
    ("What's the capital of France?", ""),
)


def tools() -> list[dict[str, Any]]:
    """The voice session's built-in functions as the API's `tools`."""
    return [tool_object(function) for function in BUILTIN_FUNCTIONS]


def serve(checkout: Path, model: str, port: int) -> subprocess.Popen[bytes]:
    """`dlm-serve --model FILE` run from `checkout`'s code; returns once /readyz answers."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    process = subprocess.Popen([sys.executable, "-m", "model.server.cli", "--model", model, "--port", str(port),
                                "--served-name", "m", "--log-level", "warning"], cwd=checkout, env=env)
    wait_ready(f"http://127.0.0.1:{port}/readyz", 600, process)
    return process


def outcome(client: openai.OpenAI, request: str, offered: list[dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    choice = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": request}], tools=offered, tool_choice="auto",
        parallel_tool_calls=False, max_tokens=64, temperature=0.0).choices[0]
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or ()]
    return {"request": request, "calls": calls, "content": choice.message.content, "finish": choice.finish_reason,
            "seconds": round(time.perf_counter() - started, 2)}


def right(row: dict[str, Any], expected: str, offered: list[dict[str, Any]]) -> bool:
    """The kind's tool called with arguments that parse and name only declared parameters; no call where none is
    due."""
    if not expected:
        return not row["calls"]
    if len(row["calls"]) != 1 or row["calls"][0]["name"] != expected:
        return False
    arguments = json.loads(row["calls"][0]["arguments"])
    schema = next(t["function"]["parameters"] for t in offered if t["function"]["name"] == expected)
    return isinstance(arguments, dict) and set(arguments) <= set(schema.get("properties", {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the GGUF to serve (a user's own model)")
    parser.add_argument("--checkout", action="append", type=Path, default=None,
                        help="a checkout whose dlm-serve answers (repeatable; default: this one)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    offered = tools()
    results: dict[str, list[dict[str, Any]]] = {}
    for checkout in args.checkout or [HERE]:
        port = free_port()
        process = serve(checkout.resolve(), args.model, port)
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                                   timeout=300)
            rows = [outcome(client, request, offered) for request, _ in REQUESTS]
        finally:
            process.terminate()
            process.wait(30)
        for row, (_, expected) in zip(rows, REQUESTS, strict=True):
            row["right"] = right(row, expected, offered)
        results[str(checkout)] = rows
        print(f"\n{checkout}: {sum(row['right'] for row in rows)} of {len(rows)} right")
        for row in rows:
            said = (", ".join(f"{c['name']}({c['arguments']})" for c in row["calls"])
                    or repr((row["content"] or "")[:70]))
            print(f"  {'ok ' if row['right'] else 'BAD'} {row['request']:<36} {row['finish']:<10} {said}")
    no_tool = [i for i, (_, expected) in enumerate(REQUESTS) if not expected]
    answers = {key: [(rows[i]["content"], rows[i]["calls"]) for i in no_tool] for key, rows in results.items()}
    print(f"\nanswers of the requests that need no tool the same in every checkout: "
          f"{len({json.dumps(a) for a in answers.values()}) == 1}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
