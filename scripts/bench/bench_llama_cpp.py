"""The bundled LM side by side with llama.cpp, the engine a user would run instead, on the very GGUF we ship.

    python scripts/bench/bench_llama_cpp.py [--limit 120] [--threads 1,2] [--max-tokens 64] [--rounds 1] [--json PATH]
        [--engines llama.cpp,autoregressive,self-speculative] [--weights int4|bf16] [--model FILE [--adapter DIR]]

Every engine answers the same held-out prompts (tests/data/heldout_prompts.txt; nothing was tuned on them) under the
voice system prompt, greedy, from the same token ids: llama.cpp through `llama-cpp-python` (`make install-bench`
builds it for this CPU, about 6 minutes on 2 cores), and this runtime's autoregressive and self-speculative decoding
on one loaded model a thread count, through the batch runner as every answer runs. Each engine and thread count
lives in its own worker process, so no thread pool spins beside another's passes (and our runner's thread keeps the
thread count it starts with); the driver hands them the prompts interleaved (prompt by prompt, thread count by
thread count, the engines' order alternating), so none gets the quieter minutes of a shared machine. Both reuse the
cached system prompt between prompts (llama.cpp's longest-prefix reuse, our slot cache).

Reported per thread count and engine: decode tokens/s (tokens after the first over the time after the first token),
first-token ms (p50 and p95: the new prompt tokens' prefill and the first token), answer tokens, resident memory
after the load and after the answers (anonymous pages and mapped files' pages: llama.cpp reads the GGUF in place,
this runtime packs its blocks, scripts/report_lib/resident.py), and each engine's decode rate over llama.cpp's;
with --rounds N the prompts are answered N times over, and each round's decode rate of every engine over the first
one's shows how far a ratio moves from one run to the next on this machine. Also: how many self-speculative answers
equal the autoregressive ones token for token
(the exactness claim), and how many of ours equal llama.cpp's (same file, different kernels: a measure of how
close the int4 teacher is to the file's own arithmetic). Figures are printed, never asserted.

`--model FILE` runs a user's GGUF instead of the bundled model, on both sides: llama.cpp on FILE, and this runtime
on FILE as `--model FILE` serves it (its own blocks in the C kernels on a CPU); the prompts are written by the file's
own chat template and tokenizer, and an answer ends at the file's end-of-turn tokens. With a draft adapter for it
(`dlm adapt`: `--adapter DIR`, or one kept beside the file) this runtime decodes it self-speculatively as well as
autoregressively, same weights; without one, autoregressively only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from model.process.threads import set_torch_threads
from scripts.report_lib.passes import answer_refinements
from scripts.report_lib.resident import resident_memory
from scripts.report_lib.stats import percentile

ROOT = Path(__file__).resolve().parents[2]

HELDOUT = ROOT / "tests" / "data" / "heldout_prompts.txt"
ENGINES = ("llama.cpp", "autoregressive", "self-speculative")
HOW_TO_GET_LLAMA_CPP = (
    "llama-cpp-python is not installed: `make install-bench` builds it for this CPU (~6 minutes on 2 cores), "
    "or `pip install '.[bench]'` with CMAKE_ARGS=-DGGML_NATIVE=ON"
)


@dataclass(frozen=True, slots=True)
class Answer:
    ids: list[int]
    first_token_s: float  # from the call to the first answer token
    total_s: float

    @property
    def decode_tokens_per_s(self) -> float | None:
        after = self.total_s - self.first_token_s
        return (len(self.ids) - 1) / after if len(self.ids) > 1 and after > 0 else None


# --- workers: each runs in its own process ---------------------------------------------------------------------------
def _llama_cpp_worker(conn: Connection, gguf: str, threads: int, eos: list[int]) -> None:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    conn.send(("ready", resident_memory()))
    while (request := conn.recv()) is not None:
        prompt, max_tokens = request
        started = time.perf_counter()
        ids: list[int] = []
        first = 0.0
        for token in llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            if not ids:
                first = time.perf_counter() - started
            if token in eos:
                break
            ids.append(int(token))
            if len(ids) >= max_tokens:
                break
        conn.send(Answer(ids, first, time.perf_counter() - started))
    conn.send(resident_memory())


def _runtime_worker(conn: Connection, model: str | None, adapter: str | None, weights: str, threads: int) -> None:
    import dataclasses


    set_torch_threads(threads)  # before the load: the batch runner's thread keeps the count it starts with

    from model.bundled.default_model import load_default_chat_model
    from model.chat.engine import DiffusionChatModel
    from model.chat.spec import ModelSpec
    from model.loading import load_chat_model

    if model is None:
        chat = load_default_chat_model(ModelSpec(weights=weights))
    else:
        loaded = load_chat_model(ModelSpec(source=model, adapter=adapter))
        if not isinstance(loaded, DiffusionChatModel):
            raise TypeError(f"{model}: not a model of this runtime's back end")
        chat = loaded
    conn.send(("ready", resident_memory()))
    while (request := conn.recv()) is not None:
        prompt, max_tokens, decoding = request
        config = dataclasses.replace(chat.sampler, decoding=decoding)
        started = time.perf_counter()
        first = None
        final = None
        for refinement in answer_refinements(chat, prompt, max_tokens, config):  # the loop every answer runs
            if first is None and refinement.committed_prefix > 0:
                first = time.perf_counter() - started
            final = refinement
        total = time.perf_counter() - started
        n = final.answer_length if final is not None else 0
        conn.send(Answer(list(final.tokens[:n]) if final else [], first or total, total))
    conn.send(resident_memory())


class Worker:
    def __init__(self, target: Any, *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=target, args=(child, *args), daemon=True)
        self.process.start()
        ready, self.memory_after_load = self.conn.recv()
        if ready != "ready":
            raise RuntimeError("worker failed to start")
        self.memory_after_run: dict[str, float] = {}

    def ask(self, *request: Any) -> Answer:
        self.conn.send(request)
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.memory_after_run = self.conn.recv()
        self.process.join(timeout=30)


# --- the run ---------------------------------------------------------------------------------------------------------
def summarize(answers: list[Answer]) -> dict[str, float]:
    decode_tokens = sum(len(a.ids) - 1 for a in answers if len(a.ids) > 1)
    decode_s = sum(a.total_s - a.first_token_s for a in answers if len(a.ids) > 1)
    firsts = [a.first_token_s * 1000 for a in answers]
    return {
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s else float("nan"),
        "first_token_ms_p50": percentile(firsts, 50),
        "first_token_ms_p95": percentile(firsts, 95),
        "answer_tokens_mean": statistics.fmean(len(a.ids) for a in answers),
        "tokens_per_s_wall": sum(len(a.ids) for a in answers) / sum(a.total_s for a in answers),
    }


def _tokenizer(model: Path | None) -> tuple[Path, Any, list[int]]:
    """(the GGUF llama.cpp runs, the tokenizer that writes the prompts, the ids that end an answer): the bundled
    model's, or `model`'s own as `--model` loads it (its template's BOS and end-of-message tokens)."""
    from transformers import AutoTokenizer

    if model is None:
        from model.bundled.default_model import base_gguf_path, ensure_base_checkpoint

        tokenizer = AutoTokenizer.from_pretrained(ensure_base_checkpoint())
        return base_gguf_path(), tokenizer, [int(tokenizer.eos_token_id)]
    from model.adapters.gguf_model import begin_with_bos, end_ids
    from model.chat.spec import ModelSpec

    header = ModelSpec(source=str(model)).gguf
    if header is None:
        raise SystemExit(f"{model}: not a GGUF file")
    tokenizer = AutoTokenizer.from_pretrained(str(header.path.parent), gguf_file=header.path.name)
    begin_with_bos(tokenizer, header)
    return header.path, tokenizer, sorted(end_ids(tokenizer, header))


def _draft_adapter(model: Path, adapter: Path | None) -> Path | None:
    """The draft adapter `--model model --adapter adapter` decodes with (None: autoregressively only)."""
    from model.chat.spec import ModelSpec
    from model.errors import ModelError

    try:
        return ModelSpec(source=str(model), adapter=None if adapter is None else str(adapter)).draft_adapter
    except ModelError as error:
        raise SystemExit(f"bench_llama_cpp: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=120)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="answer the prompts this many times over")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--weights", choices=("auto", "int4", "bf16"), default="auto", help="this runtime's")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--model", type=Path, default=None,
                        help="a GGUF file to run on both engines instead of the bundled model")
    parser.add_argument("--adapter", type=Path, default=None,
                        help="--model's draft adapter (default: the one beside the file, if any)")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}: choose from {', '.join(ENGINES)}")
    if args.adapter is not None and args.model is None:
        parser.error("--adapter is --model's: the bundled model has its own")
    drafts_with: Path | None = None
    if args.model is not None:
        if args.weights != "auto":
            parser.error("--weights is the bundled model's: a GGUF runs on its own blocks")
        drafts_with = _draft_adapter(args.model, args.adapter)
        if drafts_with is None:
            if "self-speculative" in engines and args.engines != parser.get_default("engines"):
                parser.error("this GGUF has no draft adapter (`dlm adapt`): it decodes autoregressively only")
            engines = [e for e in engines if e != "self-speculative"]
    threads = [int(t) for t in args.threads.split(",")]
    if "llama.cpp" in engines:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print(HOW_TO_GET_LLAMA_CPP)
            engines.remove("llama.cpp")
            if not engines:
                return 1

    from voice.think.spoken import SPOKEN_SYSTEM_PROMPT

    gguf, tokenizer, eos = _tokenizer(args.model)
    prompts = [line for line in HELDOUT.read_text().splitlines() if line.strip()][: args.limit]
    prompt_ids = [
        tokenizer.encode(tokenizer.apply_chat_template(
            [{"role": "system", "content": SPOKEN_SYSTEM_PROMPT}, {"role": "user", "content": p}],
            add_generation_prompt=True, tokenize=False,
        ), add_special_tokens=False)
        for p in prompts
    ]
    workers: dict[tuple[str, int], Worker] = {}
    if "llama.cpp" in engines:
        for t in threads:
            workers[("llama.cpp", t)] = Worker(_llama_cpp_worker, str(gguf), t, eos)
    runtimes: dict[int, Worker] = {}
    if any(e != "llama.cpp" for e in engines):
        model = None if args.model is None else str(args.model)
        adapter = None if drafts_with is None else str(drafts_with)  # the one the report names
        runtimes = {t: Worker(_runtime_worker, model, adapter, args.weights, t) for t in threads}

    def ask(engine: str, t: int, ids: list[int]) -> Answer:
        if engine == "llama.cpp":
            return workers[(engine, t)].ask(ids, args.max_tokens)
        return runtimes[t].ask(ids, args.max_tokens, engine)

    for t in threads:  # warm up: kernels built, caches of the system prompt filled
        for engine in engines:
            for ids in prompt_ids[:2]:
                ask(engine, t, ids)
    # per round, thread count and engine: the answers in prompt order
    results: list[dict[int, dict[str, list[Answer]]]] = []
    started = time.monotonic()
    for round_index in range(args.rounds):
        results.append({t: {e: [] for e in engines} for t in threads})
        for index, ids in enumerate(prompt_ids):
            for t in threads:
                order = engines if (index + round_index) % 2 == 0 else engines[::-1]
                for engine in order:
                    results[-1][t][engine].append(ask(engine, t, ids))
            if (index + 1) % 10 == 0:
                print(f"  round {round_index + 1}/{args.rounds}: {index + 1}/{len(prompt_ids)} prompts, "
                      f"{time.monotonic() - started:.0f} s", flush=True)
    for worker in [*workers.values(), *runtimes.values()]:
        worker.close()

    report: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(), "model": str(gguf), "prompts": len(prompt_ids),
        "weights": args.weights if args.model is None else "own blocks",
        "adapter": None if drafts_with is None else str(drafts_with),
        "max_tokens": args.max_tokens, "rounds": args.rounds, "threads": {},
    }
    for t in threads:
        rows = {e: summarize([a for run in results for a in run[t][e]]) for e in engines}
        for engine, row in rows.items():
            worker = workers[(engine, t)] if engine == "llama.cpp" else runtimes[t]
            for when, memory in (("after_load", worker.memory_after_load), ("after_run", worker.memory_after_run)):
                for name in ("rss_mb", "anonymous_mb", "file_mb"):
                    row[f"{name.removesuffix('_mb')}_{when}_mb"] = memory.get(name, float("nan"))
        per_round = {
            e: [summarize(run[t][e])["decode_tokens_per_s"] / summarize(run[t][engines[0]])["decode_tokens_per_s"]
                for run in results]
            for e in engines[1:]
        }
        base = rows.get("llama.cpp", {}).get("decode_tokens_per_s")
        for row in rows.values():
            row["vs_llama_cpp"] = row["decode_tokens_per_s"] / base if base else float("nan")
        same: dict[str, float] = {}

        def identical(a: str, b: str, t: int = t) -> float:
            pairs = [(x, y) for run in results for x, y in zip(run[t][a], run[t][b], strict=True)]
            return statistics.fmean(x.ids == y.ids for x, y in pairs)

        if {"autoregressive", "self-speculative"} <= set(engines):
            same["self-speculative == autoregressive"] = identical("autoregressive", "self-speculative")
        if "llama.cpp" in engines and "autoregressive" in engines:
            same["autoregressive == llama.cpp"] = identical("autoregressive", "llama.cpp")
        report["threads"][str(t)] = {"engines": rows, "identical_answers": same, "per_round_vs_first": per_round}
        print(f"\n{gguf.name}: {len(prompt_ids)} held-out prompts x {args.rounds} round(s), {t} thread(s), greedy, "
              f"weights {report['weights']}:")
        print(f"  {'engine':18} {'decode tok/s':>12} {'vs llama.cpp':>12} {'first token p50/p95 ms':>24} {'tokens':>7}")
        for engine, row in rows.items():
            print(f"  {engine:18} {row['decode_tokens_per_s']:12.1f} {row['vs_llama_cpp']:11.2f}x "
                  f"{row['first_token_ms_p50']:14.0f} / {row['first_token_ms_p95']:5.0f} "
                  f"{row['answer_tokens_mean']:7.1f}")
        print(f"  {'engine':18} {'resident MB after load / after the answers (anonymous + file pages)':>70}")
        for engine, row in rows.items():
            print(f"  {engine:18} {row['rss_after_load_mb']:15.0f} ({row['anonymous_after_load_mb']:.0f} + "
                  f"{row['file_after_load_mb']:.0f}) / {row['rss_after_run_mb']:.0f} "
                  f"({row['anonymous_after_run_mb']:.0f} + {row['file_after_run_mb']:.0f})")
        for name, rate in same.items():
            print(f"  identical answers, {name}: {rate:.1%}")
        if args.rounds > 1:
            for engine, ratios in per_round.items():
                print(f"  {engine} / {engines[0]}, decode rate by round: "
                      + " ".join(f"{r:.3f}" for r in ratios)
                      + f" (mean {statistics.fmean(ratios):.3f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
