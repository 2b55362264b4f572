"""Evaluate the bundled block-diffusion model against its own teacher on held-out prompts (quality and speed).

    python scripts/eval_default_model.py [--adapter model/default] [--limit 100] [--thresholds 0.9,0.7] --json PATH

For every held-out prompt (tests/data/heldout_prompts.txt, never trained on) the teacher (SmolLM2-135M-Instruct) answers
greedily with its KV cache, and the diffusion model answers with the sampler. Reported per threshold:

* quality: the teacher's perplexity of the diffusion answers divided by its perplexity of its own answers (goal <= 1.5),
  ROUGE-L F1 against the teacher's answers, and the share of answers that end with EOS within 64 tokens (goal >= 90 %);
* speed, in the same run on the same cores: tokens per pass (goal >= 2.5) and tokens/s against the teacher
  (goal >= 2.5x).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.chat import ChatMessage, GenerationOptions  # noqa: E402
from model.default_model import ADAPTER_DIR, VOICE_SYSTEM_PROMPT, load_base, load_default_chat_model  # noqa: E402
from model.teacher_data import chat_prompt_ids  # noqa: E402

HELDOUT = ROOT / "tests" / "data" / "heldout_prompts.txt"
EXAMPLE_COUNT = 5  # the first five held-out prompts, fixed by position before any output was seen


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 over lower-cased words (longest common subsequence)."""
    a, b = words(candidate), words(reference)
    if not a or not b:
        return float(a == b)
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


@torch.inference_mode()
def answer_nll(teacher, prompt_ids: list[int], answer_ids: list[int]) -> tuple[float, int]:
    """Summed negative log-likelihood of `answer_ids` after `prompt_ids` under the teacher, and the token count."""
    if not answer_ids:
        return 0.0, 0
    ids = torch.tensor([prompt_ids + answer_ids])
    logits = teacher(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(answer_ids), reduction="sum")
    return float(nll), len(answer_ids)


@torch.inference_mode()
def teacher_answer(teacher, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
    started = time.perf_counter()
    out = teacher.generate(
        input_ids=torch.tensor([prompt_ids]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    seconds = time.perf_counter() - started
    return out[0, len(prompt_ids) :].tolist(), seconds


def evaluate(args: argparse.Namespace, threshold: float, prompts: list[str], teacher, tokenizer, teacher_runs) -> dict:
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    chat = load_default_chat_model(adapter_dir=args.adapter, dtype=dtype, threshold=threshold, remasking=args.remasking)
    eos = tokenizer.eos_token_id
    options = GenerationOptions(max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0)
    rows = []
    for prompt, (teacher_ids, _teacher_s) in tqdm(
        list(zip(prompts, teacher_runs, strict=True)), desc=f"diffusion @ {threshold}"
    ):
        messages = [ChatMessage("system", VOICE_SYSTEM_PROMPT), ChatMessage("user", prompt)]
        started = time.perf_counter()
        passes, final = 0, None
        for draft in chat.stream_chat(messages, options):
            passes += 1
            final = draft
        seconds = time.perf_counter() - started
        if final is None or final.refinement is None:
            raise RuntimeError("the diffusion model produced no refinement")
        refinement = final.refinement
        answer_ids = list(refinement.tokens[: refinement.answer_length])
        ended = final.finish_reason == "stop"
        rows.append(
            {
                "prompt": prompt,
                "answer": final.text.strip(),
                "answer_ids": answer_ids + ([eos] if ended else []),
                "teacher_ids": teacher_ids,
                "ended_with_eos": ended,
                "passes": passes,
                "tokens": len(answer_ids) + (1 if ended else 0),
                "seconds": seconds,
            }
        )
    prompt_ids = [chat_prompt_ids(tokenizer, VOICE_SYSTEM_PROMPT, p) for p in prompts]
    nll_d = [answer_nll(teacher, p, r["answer_ids"]) for p, r in zip(prompt_ids, rows, strict=True)]
    nll_t = [answer_nll(teacher, p, r["teacher_ids"]) for p, r in zip(prompt_ids, rows, strict=True)]
    ppl_d = math.exp(sum(n for n, _ in nll_d) / max(1, sum(c for _, c in nll_d)))
    ppl_t = math.exp(sum(n for n, _ in nll_t) / max(1, sum(c for _, c in nll_t)))
    teacher_tokens = sum(len(ids) for ids, _ in teacher_runs)
    teacher_seconds = sum(s for _, s in teacher_runs)
    tokens = sum(r["tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    passes = sum(r["passes"] for r in rows)
    for row in rows:
        row["teacher_answer"] = tokenizer.decode(row["teacher_ids"], skip_special_tokens=True).strip()
        row["rouge_l"] = rouge_l(row["answer"], row["teacher_answer"])
    return {
        "threshold": threshold,
        "remasking": args.remasking,
        "prompts": len(rows),
        "perplexity_ratio": ppl_d / ppl_t,
        "teacher_ppl_of_diffusion_answers": ppl_d,
        "teacher_ppl_of_teacher_answers": ppl_t,
        "rouge_l": sum(r["rouge_l"] for r in rows) / len(rows),
        "eos_within_limit": sum(r["ended_with_eos"] for r in rows) / len(rows),
        "tokens_per_pass": tokens / passes,
        "tokens_per_second": tokens / seconds,
        "teacher_tokens_per_second": teacher_tokens / teacher_seconds,
        "speedup_vs_teacher": (tokens / seconds) / (teacher_tokens / teacher_seconds),
        "examples": [{k: row[k] for k in ("prompt", "teacher_answer", "answer")} for row in rows[:EXAMPLE_COUNT]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", type=Path, default=ADAPTER_DIR)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--thresholds", default="0.9,0.7,0.5")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--remasking", default="left_to_right", help="which positions a pass must commit")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True, help="both models in bf16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    prompts = [line for line in HELDOUT.read_text().splitlines() if line.strip()][: args.limit]
    teacher, tokenizer = load_base(torch.float32)  # perplexities in full precision
    # timed in the same precision as the diffusion model, so the speed ratio compares like with like
    timed_teacher, _ = load_base(torch.bfloat16) if args.bf16 else (teacher, tokenizer)
    teacher_runs = []
    for prompt in tqdm(prompts, desc="teacher (greedy, KV cache)"):
        ids, seconds = teacher_answer(timed_teacher, tokenizer, chat_prompt_ids(tokenizer, VOICE_SYSTEM_PROMPT, prompt),
                                      args.max_new_tokens)
        teacher_runs.append((ids, seconds))
    results = [
        evaluate(args, float(t), prompts, teacher, tokenizer, teacher_runs) for t in args.thresholds.split(",")
    ]
    header = ("threshold", "ppl ratio", "ROUGE-L", "EOS<=64", "tok/pass", "tok/s", "vs AR")
    print("\n" + " ".join(f"{h:>9}" for h in header))
    for r in results:
        print(
            f"{r['threshold']:>9.2f} {r['perplexity_ratio']:>9.2f} {r['rouge_l']:>9.3f} {r['eos_within_limit']:>9.1%} "
            f"{r['tokens_per_pass']:>9.2f} {r['tokens_per_second']:>9.1f} {r['speedup_vs_teacher']:>8.2f}x"
        )
    print(f"teacher: {results[0]['teacher_tokens_per_second']:.1f} tokens/s greedy with KV cache")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": " ".join(sys.argv),
            "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads, "bf16": args.bf16},
            "results": results,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
