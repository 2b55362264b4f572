"""Throughput and latency of dlm-serve with 1, 4, 8... concurrent clients, over loopback, with the official openai
client, on held-out questions (tests/data/heldout_prompts.txt: nothing was tuned on them).

    python scripts/bench/bench_api.py                                      # a tiny random BERT (the server alone)
    python scripts/bench/bench_api.py --model default --clients 1 4 8      # the bundled model
    python scripts/bench/bench_api.py --model PATH --json artifacts/bench_api.json

Each client sends diffusing streaming requests one after another, greedy (temperature 0); "first draft" is the first
chunk with non-empty draft text (what speculative TTS can start on), "latency" the whole answer. Throughput counts
committed completion tokens (from `usage`) over the wall time of a level, and is shown against the first level's (one
client). Every level asks the same questions, so each answer is checked against the same question's answer at the
first level: an answer must not depend on who else is being served. Bounded: --requests per level and --max-seconds
per level.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import openai

from model.chat import ChatModel
from model.server.background import serve_in_thread
from model.server.config import ServerConfig
from scripts.report_lib.stats import percentile_or
from scripts.report_lib.tiny_models import tiny_bert

HELDOUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "heldout_prompts.txt"


@dataclass(frozen=True, slots=True)
class RequestResult:
    client: int
    prompt: str
    text: str
    first_draft_s: float
    latency_s: float
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class LevelResult:
    clients: int
    requests: int
    errors: int
    wall_s: float
    tokens_per_answer: float
    tokens_per_s: float
    # Tokens per second of this process's CPU time (server and clients, every thread): what the answers cost, much less
    # sensitive than tokens_per_s to other jobs taking the cores.
    tokens_per_cpu_s: float
    first_draft_p50_s: float
    first_draft_p95_s: float
    latency_p50_s: float
    latency_p95_s: float
    first_draft_p50_by_client_s: tuple[float, ...]  # each client's own median: is any client starved?
    answers: dict[str, str]  # question -> answer


async def one_request(
    client: openai.AsyncOpenAI, model: str, prompt: str, max_tokens: int, index: int = 0
) -> RequestResult:
    start = time.perf_counter()
    first_draft = None
    tokens = 0
    text = ""  # a diffusing stream's chunk carries the whole current draft: the last one is the answer
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"diffusing": True},
    )
    async for chunk in stream:
        if first_draft is None and chunk.choices and chunk.choices[0].delta.content:
            first_draft = time.perf_counter() - start
        if chunk.choices and chunk.choices[0].delta.content:
            text = chunk.choices[0].delta.content
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    latency = time.perf_counter() - start
    first = first_draft if first_draft is not None else latency
    return RequestResult(index, prompt, text, first, latency, tokens)


async def run_level(base_url: str, model: str, clients: int, prompts: list[str], max_tokens: int,
                    max_seconds: float) -> LevelResult:
    """Every question of `prompts` once, spread over `clients` clients that each ask one after another."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=max_seconds)
    results: list[RequestResult] = []
    errors = 0
    issued = 0
    start = time.perf_counter()
    cpu_start = time.process_time()
    deadline = start + max_seconds

    async def worker(index: int) -> None:
        nonlocal issued, errors
        while issued < len(prompts) and time.perf_counter() < deadline:
            prompt = prompts[issued]
            issued += 1
            try:
                results.append(await one_request(client, model, prompt, max_tokens, index))
            except openai.APIError as error:
                errors += 1
                print(f"  request failed: {error}", file=sys.stderr)

    await asyncio.gather(*(worker(index) for index in range(clients)))
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    await client.close()
    firsts = [result.first_draft_s for result in results]
    latencies = [result.latency_s for result in results]
    return LevelResult(
        clients=clients,
        requests=len(results),
        errors=errors,
        wall_s=round(wall, 3),
        tokens_per_answer=round(sum(r.completion_tokens for r in results) / max(len(results), 1), 1),
        tokens_per_s=round(sum(result.completion_tokens for result in results) / wall, 2),
        tokens_per_cpu_s=round(sum(result.completion_tokens for result in results) / max(cpu, 1e-9), 2),
        first_draft_p50_s=round(percentile_or(firsts, 50, math.nan), 3),
        first_draft_p95_s=round(percentile_or(firsts, 95, math.nan), 3),
        latency_p50_s=round(percentile_or(latencies, 50, math.nan), 3),
        latency_p95_s=round(percentile_or(latencies, 95, math.nan), 3),
        first_draft_p50_by_client_s=tuple(
            round(percentile_or([r.first_draft_s for r in results if r.client == index], 50, math.nan), 3)
            for index in range(clients)
        ),
        answers={result.prompt: result.text for result in results},
    )


def load_model(spec: str, decoding: str | None = None) -> ChatModel:
    from model.chat.spec import DecodingSettings, ModelSpec
    from model.loading import load_chat_model

    if spec == "tiny":
        folder = tiny_bert(Path(tempfile.mkdtemp(prefix="bench-api-")) / "tiny-bert")
        return load_chat_model(ModelSpec(str(folder), decoding=DecodingSettings(block_length=8)))
    return load_chat_model(ModelSpec(None if spec == "default" else spec, decoding=DecodingSettings(decoding=decoding)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (random BERT), 'default' (bundled), or a spec")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=16, help="held-out questions per concurrency level")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-seconds", type=float, default=120.0, help="time bound per level")
    parser.add_argument("--decoding", default=None, help="self-speculative, autoregressive or diffusion (default: "
                        "the model's own)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    load_start = time.perf_counter()
    model = load_model(args.model, args.decoding)
    print(f"model {model.name!r} loaded in {time.perf_counter() - load_start:.1f} s")
    config = ServerConfig(max_queue=max(args.clients) + 1, max_tokens_limit=max(args.max_tokens, 1),
                          default_max_tokens=max(args.max_tokens, 1))
    prompts = [line for line in HELDOUT.read_text().splitlines() if line.strip()][: args.requests]
    levels: list[LevelResult] = []
    with serve_in_thread(model, config) as server:
        asyncio.run(run_level(server.api_url, model.name, 1, ["Hello!"], args.max_tokens, args.max_seconds))  # warm-up
        for clients in args.clients:
            level = asyncio.run(run_level(server.api_url, model.name, clients, prompts, args.max_tokens,
                                          args.max_seconds))
            levels.append(level)
            first = levels[0]
            same = [level.answers[p] == first.answers[p] for p in level.answers if p in first.answers]
            print(
                f"clients={level.clients} requests={level.requests} errors={level.errors} wall={level.wall_s:.2f}s "
                f"tokens/answer={level.tokens_per_answer:.1f} tokens/s={level.tokens_per_s:.1f} "
                f"({level.tokens_per_s / first.tokens_per_s:.2f}x {first.clients} client(s)) "
                f"tokens/cpu-s={level.tokens_per_cpu_s:.1f}\n"
                f"  answers as at {first.clients} client(s): {sum(same)}/{len(same)}\n"
                f"  first_draft p50/p95={level.first_draft_p50_s:.3f}/"
                f"{level.first_draft_p95_s:.3f}s latency p50/p95={level.latency_p50_s:.3f}/{level.latency_p95_s:.3f}s\n"
                f"  first_draft p50 by client: {', '.join(f'{v:.3f}s' for v in level.first_draft_p50_by_client_s)}"
            )
        stats = asdict(server.scheduler.stats)
    print(f"scheduler: {stats}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"model": model.name, "max_tokens": args.max_tokens, "levels": [asdict(level) for level in levels],
                  "scheduler": stats}
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
