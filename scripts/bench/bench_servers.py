"""The bundled LM served, side by side with llama.cpp's server, through the same `openai` client: what a user of either
OpenAI-compatible server sees, prefill and HTTP included.

    python scripts/bench/bench_servers.py [--limit 30] [--threads 2] [--max-tokens 64] [--json PATH]
        [--decoding self-speculative,autoregressive]

Servers, each in its own process on loopback: llama-cpp-python's (`python -m llama_cpp.server`, the `bench` extra:
`make install-bench`) on the very GGUF we ship, and one `dlm-serve` per decoding mode, all at `--threads` threads.
Every server answers the same held-out questions (tests/data/heldout_prompts.txt, from the last one backwards, so
the 30 are not the first 30 that scripts/bench/bench_llama_cpp.py starts with) under the voice system prompt, greedy,
streaming; the questions are interleaved (question by question, the servers' order alternating), one request at a
time, so no server runs while another does.

Reported per server: decode tokens/s (tokens after the first over the time after the first), end-to-end tokens/s
(all tokens over the whole request: prefill, HTTP and streaming included), first-token ms p50/p95, answer tokens,
and each one's rates over llama.cpp's. Tokens are counted by the model's tokenizer from the streamed text, the same
way for every server. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from scripts.report_lib.load import free_port
from scripts.report_lib.stats import percentile

ROOT = Path(__file__).resolve().parents[2]

HELDOUT = ROOT / "tests" / "data" / "heldout_prompts.txt"
DECODINGS = ("self-speculative", "autoregressive")
HOW_TO_GET_THE_SERVER = (
    "llama-cpp-python's server is not installed: `make install-bench` builds llama-cpp-python[server] for this CPU "
    "(~6 minutes on 2 cores)"
)


@dataclass(frozen=True, slots=True)
class Reply:
    tokens: int
    first_token_s: float
    total_s: float


class Server:
    """An OpenAI-compatible server in its own process, on a free loopback port."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], port: int, model: str) -> None:
        self.name, self.port, self.model = name, port, model
        self.log = open(ROOT / "artifacts" / f"bench_servers.{name}.log", "w")  # noqa: SIM115
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", timeout=300)

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.process.returncode}): see {self.log.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not start in {timeout_s:.0f} s: see {self.log.name}")

    def ask(self, system: str, question: str, max_tokens: int, count: Any) -> Reply:
        started = time.perf_counter()
        first: float | None = None
        text = []
        stream = self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=max_tokens, temperature=0, stream=True,
        )
        for chunk in stream:
            delta = chunk.choices[0].delta.content if chunk.choices else None
            if delta:
                first = first if first is not None else time.perf_counter() - started
                text.append(delta)
        total = time.perf_counter() - started
        return Reply(count("".join(text)), first if first is not None else total, total)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def summarize(replies: list[Reply]) -> dict[str, float]:
    decode = [(r.tokens - 1) / (r.total_s - r.first_token_s) for r in replies
              if r.tokens > 1 and r.total_s > r.first_token_s]
    firsts = [r.first_token_s * 1e3 for r in replies]
    return {
        # totals over totals: a long answer weighs as its tokens do
        "decode_tokens_per_s": sum(r.tokens - 1 for r in replies if r.tokens > 1)
        / sum(r.total_s - r.first_token_s for r in replies if r.tokens > 1) if decode else float("nan"),
        "end_to_end_tokens_per_s": sum(r.tokens for r in replies) / sum(r.total_s for r in replies),
        "first_token_ms_p50": percentile(firsts, 50),
        "first_token_ms_p95": percentile(firsts, 95),
        "answer_tokens_mean": statistics.fmean(r.tokens for r in replies),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--decoding", default=",".join(DECODINGS), help="dlm-serve's modes, one server each")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError:
        print(HOW_TO_GET_THE_SERVER)
        return 1

    from transformers import AutoTokenizer

    from model.bundled.default_model import base_gguf_path, ensure_base_checkpoint
    from voice.think.spoken import SPOKEN_SYSTEM_PROMPT

    tokenizer = AutoTokenizer.from_pretrained(ensure_base_checkpoint())

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    questions = [line for line in HELDOUT.read_text().splitlines() if line.strip()][::-1][: args.limit]
    (ROOT / "artifacts").mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    servers: list[Server] = []
    try:
        port = free_port()
        servers.append(Server("llama.cpp", [
            sys.executable, "-m", "llama_cpp.server", "--model", str(base_gguf_path()), "--model_alias", "smollm2",
            "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "2048",
            "--host", "127.0.0.1", "--port", str(port),
        ], env, port, "smollm2"))
        for mode in [m for m in args.decoding.split(",") if m]:
            port = free_port()
            servers.append(Server(f"dlm-serve {mode}", [
                sys.executable, "-m", "model.server.cli", "--port", str(port), "--decoding", mode,
                "--served-name", "smollm2",
            ], {**env, "PYTHONPATH": str(ROOT)}, port, "smollm2"))
        for server in servers:
            server.wait_ready()
        names = [s.name for s in servers]
        for server in servers:  # warm up: kernels built, the system prompt cached
            for question in questions[:2]:
                server.ask(SPOKEN_SYSTEM_PROMPT, question, args.max_tokens, count)
        replies: dict[str, list[Reply]] = {name: [] for name in names}
        started = time.monotonic()
        for index, question in enumerate(questions):
            for server in servers if index % 2 == 0 else servers[::-1]:
                replies[server.name].append(server.ask(SPOKEN_SYSTEM_PROMPT, question, args.max_tokens, count))
            if (index + 1) % 10 == 0:
                print(f"  {index + 1}/{len(questions)} questions, {time.monotonic() - started:.0f} s", flush=True)
    finally:
        for server in servers:
            server.close()

    rows = {name: summarize(r) for name, r in replies.items()}
    base = rows["llama.cpp"]
    for row in rows.values():
        row["decode_vs_llama_cpp"] = row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
        row["end_to_end_vs_llama_cpp"] = row["end_to_end_tokens_per_s"] / base["end_to_end_tokens_per_s"]
    print(f"\n{len(questions)} held-out questions through each server, {args.threads} thread(s), greedy, streaming:")
    print(f"  {'server':26} {'decode tok/s':>12} {'end-to-end tok/s':>17} {'first token p50/p95 ms':>23} "
          f"{'tokens':>7}")
    for name, row in rows.items():
        print(f"  {name:26} {row['decode_tokens_per_s']:6.1f} ({row['decode_vs_llama_cpp']:.2f}x) "
              f"{row['end_to_end_tokens_per_s']:9.1f} ({row['end_to_end_vs_llama_cpp']:.2f}x) "
              f"{row['first_token_ms_p50']:12.0f} / {row['first_token_ms_p95']:5.0f} {row['answer_tokens_mean']:7.1f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"cpu": platform.processor() or platform.machine(), "questions": len(questions),
                  "threads": args.threads, "max_tokens": args.max_tokens, "servers": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
