"""Evaluate the bundled model's decoding modes against its own autoregressive decoding, on held-out prompts.

    python scripts/train/eval_default_model.py [--adapter model/default] [--limit 120] [--modes self-speculative]
        [--verify-fp32] --json artifacts/eval_default_model.json

Every mode runs in the same runtime (same weights, dtype, prompt-cache policy, speech guard) as the autoregressive
baseline (gate off, one token per pass). Both are warmed up first, and the modes run interleaved prompt by prompt, in
alternating order, so neither gets the warmer cache or the quieter machine. Reported per mode, against autoregressive:

* exact-match rate (self-speculative decoding is lossless: it should be 100 % up to bf16 near-ties), the first
  differing position of each difference and the teacher's top-2 logit gap there (a near-tie or not);
* tokens per pass, drafted tokens ahead of the committed text, per-position draft agreement with the final answer;
* decode tokens/s ratio (passes only: the prompt's prefill is the same work in both) and wall-clock ratio;
* EOS rate, answer-length ratio, repeated word 3-gram rate, and the teacher's perplexity ratio (fp32).

With --teacher-weights bf16 (and the default int4 weights) the autoregressive answers are also decoded by a runtime
with the bf16 weights: how often the int4 teacher answers as the bf16 one does, and the perplexity ratio of its answers
against the bf16 teacher's (both scored by the fp32 model), the quality bar of model/runtime/int4_weights.py.

With --verify-fp32 every differing prompt is decoded again in fp32 by both modes, which tells a bf16 near-tie (equal in
fp32) from a real bug (different in fp32).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from model.bundled.default_model import ADAPTER_DIR, load_base, load_default_chat_model
from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.chat.spec import DecodingSettings, ModelSpec
from model.process.threads import set_torch_threads
from model.runtime.fast_pass import FastPass
from scripts.report_lib.passes import answer_refinements
from voice.think.spoken import SPOKEN_RULES, SPOKEN_SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parents[2]

HELDOUT = ROOT / "tests" / "data" / "heldout_prompts.txt"
WARMUP_PROMPTS = ("Hello! How are you today?", "What is the capital of France?", "Tell me a joke.")



def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def has_repeated_trigram(text: str) -> bool:
    w = words(text)
    grams = [tuple(w[i : i + 3]) for i in range(len(w) - 2)]
    return len(grams) != len(set(grams))


def answer_of(chat: DiffusionChatModel, prompt: str, mode: str, options: GenerationOptions, layout: str) -> dict:
    """One answer in one decoding mode: tokens, passes, timings, and the drafts each pass showed. `mode` is a
    decoding mode, for self-speculative decoding optionally with its draft layout ("self-speculative:fixed");
    `layout` is the layout a mode without one uses."""
    decoding, _, own_layout = mode.partition(":")
    config = dataclasses.replace(chat.sampler, decoding=decoding, draft_layout=own_layout or layout)
    messages = [ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", prompt)]
    prompt_ids = chat.prompt_ids(messages)
    started = time.perf_counter()
    # the loop every answer runs
    refinements = list(answer_refinements(chat, prompt_ids, options.max_new_tokens, config, options))
    wall = time.perf_counter() - started
    final = refinements[-1]
    n = final.answer_length
    drafts = []  # (committed length, drafted tokens) of every pass that drafted
    for r in refinements:
        c = r.committed_prefix
        if c < len(r.tokens):
            drafts.append((c, list(r.tokens[c:])))
    ended = final.finish_reason == "stop"
    return {
        "ids": list(final.tokens[:n]),
        "text": chat.tokenizer.decode(list(final.tokens[:n]), skip_special_tokens=True).strip(),
        "ended_with_eos": ended,
        "tokens": n + (1 if ended else 0),  # the EOS is a decoded token too
        "passes": len(refinements),
        "decode_s": sum(r.elapsed_s for r in refinements),
        "wall_s": wall,
        "ahead": [len(r.tokens) - r.committed_prefix for r in refinements if not r.done],
        "drafts": drafts,
    }


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
def top2_gap(teacher, prompt_ids: list[int], prefix: list[int]) -> float:
    """The teacher's (bf16) gap between its two best logits for the token after `prefix`: small = a near-tie."""
    logits = teacher(input_ids=torch.tensor([prompt_ids + prefix])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def draft_agreement(rows: list[dict], mode: str, width: int, eos_id: int) -> tuple[list[float], list[float]]:
    """Per position of the drafts: share equal to the final (= autoregressive) answer, and share accepted (equal and
    every draft before it equal)."""
    equal = [[0, 0] for _ in range(width)]
    accepted = [[0, 0] for _ in range(width)]
    for row in rows:
        final = row["autoregressive"]["ids"] + [eos_id]
        for start, drafted in row[mode]["drafts"]:
            run = True
            for j, token in enumerate(drafted[:width]):
                if start + j >= len(final):
                    break
                same = token == final[start + j]
                run = run and same
                equal[j][0] += same
                equal[j][1] += 1
                accepted[j][0] += run
                accepted[j][1] += 1
    return [a / max(1, b) for a, b in equal], [a / max(1, b) for a, b in accepted]


def summarize(rows: list[dict], mode: str, teacher, prompt_ids: list[list[int]], gaps: dict, eos_id: int) -> dict:
    ar = [row["autoregressive"] for row in rows]
    md = [row[mode] for row in rows]
    same = [a["ids"] == m["ids"] for a, m in zip(ar, md, strict=True)]

    def rate(side: list[dict]) -> float:
        return sum(s["tokens"] for s in side) / sum(s["decode_s"] for s in side)

    def ppl(side: list[dict]) -> float:
        nll = [answer_nll(teacher, p, s["ids"] + ([eos_id] if s["ended_with_eos"] else [])) for p, s in
               zip(prompt_ids, side, strict=True)]
        return math.exp(sum(n for n, _ in nll) / max(1, sum(c for _, c in nll)))

    equal, accepted = draft_agreement(rows, mode, 8, eos_id)
    ahead = [a for m in md for a in m["ahead"]]
    differences = []
    for row, a, m, ok in zip(rows, ar, md, same, strict=True):
        if ok:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a["ids"], m["ids"], strict=False)) if x != y),
                     min(len(a["ids"]), len(m["ids"])))
        differences.append({
            "prompt": row["prompt"], "first_difference": first,
            "autoregressive": a["text"], mode: m["text"], "teacher_top2_gap_bf16": gaps.get((row["prompt"], mode)),
            "equal_in_fp32": row.get(f"{mode}_fp32_equal"),
        })
    return {
        "mode": mode,
        "prompts": len(rows),
        "exact_match_vs_autoregressive": sum(same) / len(rows),
        "tokens_per_pass": sum(m["tokens"] for m in md) / sum(m["passes"] for m in md),
        "drafted_ahead_mean": statistics.fmean(ahead) if ahead else 0.0,
        "draft_equal_by_position": equal,
        "draft_accepted_by_position": accepted,
        "tokens_per_s": rate(md),
        "autoregressive_tokens_per_s": rate(ar),
        "speedup_decode": rate(md) / rate(ar),
        "speedup_wall": sum(a["wall_s"] for a in ar) / sum(m["wall_s"] for m in md),
        "eos_rate": sum(m["ended_with_eos"] for m in md) / len(rows),
        "autoregressive_eos_rate": sum(a["ended_with_eos"] for a in ar) / len(rows),
        "answer_length_ratio": sum(len(m["ids"]) for m in md) / max(1, sum(len(a["ids"]) for a in ar)),
        "repeated_trigram_rate": sum(has_repeated_trigram(m["text"]) for m in md) / len(rows),
        "autoregressive_repeated_trigram_rate": sum(has_repeated_trigram(a["text"]) for a in ar) / len(rows),
        "perplexity_ratio_vs_autoregressive": ppl(md) / ppl(ar),
        "differences": differences,
    }


def compare_teachers(rows: list[dict], teacher32, prompt_ids: list[list[int]], eos_id: int) -> dict:
    """This runtime's autoregressive answers against the reference weights' ones (`row["teacher"]`)."""

    def ppl(side: list[dict]) -> float:
        nll = [answer_nll(teacher32, p, s["ids"] + ([eos_id] if s["ended_with_eos"] else [])) for p, s in
               zip(prompt_ids, side, strict=True)]
        return math.exp(sum(n for n, _ in nll) / max(1, sum(c for _, c in nll)))

    ours, theirs = [row["autoregressive"] for row in rows], [row["teacher"] for row in rows]
    return {
        "identical": statistics.fmean(a["ids"] == b["ids"] for a, b in zip(ours, theirs, strict=True)),
        "perplexity": ppl(ours),
        "reference_perplexity": ppl(theirs),
        "perplexity_ratio": ppl(ours) / ppl(theirs),
        "eos_rate": statistics.fmean(a["ended_with_eos"] for a in ours),
        "reference_eos_rate": statistics.fmean(b["ended_with_eos"] for b in theirs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", type=Path, default=ADAPTER_DIR)
    parser.add_argument("--limit", type=int, default=120)
    parser.add_argument("--modes", default="self-speculative",
                        help="compared with autoregressive (comma-separated; self-speculative:fixed or :adaptive picks"
                             " the draft layout, else the model's own)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft-masks", type=int, default=None, help="masks per self-speculative pass")
    parser.add_argument("--no-draft-branches", action="store_true",
                        help="one mask block after all drafts (used only when every draft is accepted)")
    parser.add_argument("--verify-fp32", action="store_true", help="decode each differing prompt again in fp32")
    parser.add_argument("--weights", choices=("auto", "int4", "bf16"), default="auto", help="the runtime's weights")
    parser.add_argument("--teacher-weights", choices=("int4", "bf16"), default=None,
                        help="also decode autoregressively with these weights and compare the teachers")
    parser.add_argument("--prefills", choices=("auto", "bf16"), default="auto",
                        help="how this runtime encodes prompts: as it runs on this CPU (int4 through the decode "
                        "kernel), or always with the bf16 weights (their cost to quality)")
    parser.add_argument("--drafter", type=Path, default=None,
                        help="self-speculative decoding drafts with this drafter (model/drafting/) instead of masks")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.prefills == "bf16":
        FastPass.int4_prefill = lambda self, rows: False  # type: ignore[method-assign]
    set_torch_threads(args.threads)
    options = GenerationOptions(max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0, rules=SPOKEN_RULES)
    modes = ["autoregressive", *[m for m in args.modes.split(",") if m and m != "autoregressive"]]

    prompts = [line for line in HELDOUT.read_text().splitlines() if line.strip()][: args.limit]
    settings = DecodingSettings(draft_masks=args.draft_masks, draft_branches=False if args.no_draft_branches else None)
    spec = ModelSpec(str(args.adapter) if args.adapter else None, weights=args.weights, decoding=settings)
    chat = load_default_chat_model(spec)
    if args.drafter is not None:
        chat.backend.load_drafter(args.drafter)
    eos_id = chat.tokenizer.eos_token_id
    layout = chat.sampler.draft_layout
    for prompt in WARMUP_PROMPTS:  # kernels, allocator, the guard's vocabulary scan, the system prompt's cache
        for mode in modes:
            answer_of(chat, prompt, mode, options, layout)
    rows = []
    for index, prompt in enumerate(tqdm(prompts, desc="interleaved " + " / ".join(modes))):
        row: dict = {"prompt": prompt}
        for mode in modes if index % 2 == 0 else modes[::-1]:
            row[mode] = answer_of(chat, prompt, mode, options, layout)
        rows.append(row)
    # The other teacher only after the timed runs: once its runner thread has run torch's parallel ops (its draft
    # calibration at load does), the process holds two OpenMP teams on two cores, libgomp parks its workers between
    # parallel regions, and the timed runtime's passes took 2-2.7x as long (model/runtime/passing_thread.py says why)
    reference = None
    if args.teacher_weights:
        reference = load_default_chat_model(dataclasses.replace(spec, weights=args.teacher_weights))
        for row in tqdm(rows, desc="the other teacher"):
            row["teacher"] = answer_of(reference, row["prompt"], "autoregressive", options, layout)

    prompt_ids = [chat.prompt_ids([ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", p)])
                  for p in prompts]
    teacher_bf16, _ = load_base(torch.bfloat16)  # a plain copy: the adapted model's LoRA is on outside its passes
    gaps = {}
    for row, ids in zip(rows, prompt_ids, strict=True):
        for mode in modes[1:]:
            a, m = row["autoregressive"]["ids"], row[mode]["ids"]
            if a != m:
                first = next((i for i, (x, y) in enumerate(zip(a, m, strict=False)) if x != y), min(len(a), len(m)))
                gaps[(row["prompt"], mode)] = top2_gap(teacher_bf16, ids, a[:first])
    if args.verify_fp32 and gaps:
        chat32 = load_default_chat_model(dataclasses.replace(spec, precision="fp32"))
        for row in rows:
            for mode in modes[1:]:
                if (row["prompt"], mode) in gaps:
                    ar32 = answer_of(chat32, row["prompt"], "autoregressive", options, layout)["ids"]
                    md32 = answer_of(chat32, row["prompt"], mode, options, layout)["ids"]
                    row[f"{mode}_fp32_equal"] = ar32 == md32
    teacher32, _ = load_base(torch.float32)  # perplexities in full precision
    results = [summarize(rows, mode, teacher32, prompt_ids, gaps, eos_id) for mode in modes[1:]]
    teachers = None
    if reference is not None:
        teachers = compare_teachers(rows, teacher32, prompt_ids, eos_id)
        print(f"\nautoregressive, {args.weights} weights vs {args.teacher_weights} weights on {len(rows)} prompts: "
              f"identical {teachers['identical']:.1%}, perplexity ratio {teachers['perplexity_ratio']:.3f} "
              f"(fp32-scored; {teachers['perplexity']:.3f} vs {teachers['reference_perplexity']:.3f}), "
              f"EOS {teachers['eos_rate']:.1%} vs {teachers['reference_eos_rate']:.1%}")

    for r in results:
        print(f"\n{r['mode']} vs autoregressive on {r['prompts']} held-out prompts (bf16, {args.threads} threads)")
        print(f"  exact match {r['exact_match_vs_autoregressive']:.1%}; {r['tokens_per_pass']:.2f} tokens/pass; "
              f"{r['drafted_ahead_mean']:.2f} drafted ahead; decode {r['tokens_per_s']:.1f} vs "
              f"{r['autoregressive_tokens_per_s']:.1f} tokens/s = {r['speedup_decode']:.2f}x "
              f"(wall {r['speedup_wall']:.2f}x)")
        print(f"  EOS {r['eos_rate']:.1%} (AR {r['autoregressive_eos_rate']:.1%}); length ratio "
              f"{r['answer_length_ratio']:.3f}; repeated 3-gram {r['repeated_trigram_rate']:.1%} "
              f"(AR {r['autoregressive_repeated_trigram_rate']:.1%}); ppl ratio "
              f"{r['perplexity_ratio_vs_autoregressive']:.3f}")
        print("  draft equal by position   " + " ".join(f"{x:.2f}" for x in r["draft_equal_by_position"]))
        print("  draft accepted by position " + " ".join(f"{x:.2f}" for x in r["draft_accepted_by_position"]))
        for d in r["differences"]:
            print(f"  differs at token {d['first_difference']} (top-2 gap {d['teacher_top2_gap_bf16']:.3f}, "
                  f"equal in fp32: {d['equal_in_fp32']}): {d['prompt']!r}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "command": " ".join(sys.argv),
            "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads, "dtype": "bf16",
                        "prefills": args.prefills},
            "results": results,
            "teachers": teachers,
            "answers": [{"prompt": row["prompt"], **{m: row[m]["text"] for m in modes}} for row in rows],
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
