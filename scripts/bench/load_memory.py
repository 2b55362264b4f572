"""A model's resident memory after it is loaded as `--model` loads it, split into anonymous pages (tensors made by
the load) and mapped files' pages (the GGUF's blocks read in place, the libraries' code), beside the process's own
before the load (torch and transformers imported), and how long the load took.

    python scripts/bench/load_memory.py --model FILE [--threads 1] [--answer-tokens 16]

With `--answer-tokens N` a first answer of N tokens runs after the load (the embedding's rows and the kernels'
buffers touched, as in use) and the memory is read again. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from model.process.threads import set_torch_threads
from scripts.report_lib.resident import resident_memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--answer-tokens", type=int, default=16)
    args = parser.parse_args(argv)

    import transformers  # noqa: F401  (in the baseline: every load imports it)

    set_torch_threads(args.threads)
    from model.chat import ChatMessage, GenerationOptions
    from model.chat.spec import ModelSpec
    from model.loading import load_chat_model

    baseline = resident_memory()
    started = time.perf_counter()
    chat = load_chat_model(ModelSpec(source=str(args.model)))
    report = {"model": str(args.model), "file_mb": args.model.stat().st_size / 1e6,
              "load_s": time.perf_counter() - started, "note": chat.note, "before_load": baseline,
              "after_load": resident_memory()}
    if args.answer_tokens:
        options = GenerationOptions(max_new_tokens=args.answer_tokens)
        last = list(chat.stream_chat([ChatMessage("user", "What is the capital of France?")], options))[-1]
        report["answer_tokens"] = last.completion_tokens
        report["after_answer"] = resident_memory()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
