"""A long conversation through the real `Dialogue`, as text: prompt cost and answer quality by turn index.

    python scripts/bench/bench_dialogue.py [--turns 60] [--context-chars 2400] [--json artifacts/bench_dialogue.json]

The voice session keeps a `Dialogue` (voice/think/dialogue.py) and sends its `messages()` to the LM every turn; the
LM keeps its KV cache between answers and encodes only what the new prompt does not share with the cached one. This
runs the same loop without audio (the soak's questions and the transcripts of its recordings, in its order), so that
what the history policy and the decoding do to a long conversation shows in a minute or two:

* prompt tokens, tokens found in the cache, tokens encoded, ms to the first draft and to the whole answer;
* the answer, its repeated 3-gram rate, whether it holds a 3-word loop or a contraction English lacks ("that'm");
* the base model's (SmolLM2, fp32) perplexity of the answer given the prompt it answered, and given the system prompt
  and the question alone (does the history pull the answers away from what the base model would say?).

`--history none|users|full` is an ablation: what the model sees of earlier turns; `--decoder teacher` answers with the
base model's greedy decoding instead (what a lossless decoding mode says). `--from-soak FILE` scores the answers of a
soak (scripts/soak_session.py --json) instead: the prompts are rebuilt from its transcripts and answers through the same
`Dialogue`. Figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from model.bundled.default_model import load_base, load_default_chat_model
from model.chat import ChatMessage, GenerationOptions
from scripts.report_lib.answer_quality import has_ngram_loop, non_words, repeated_ngram_rate
from scripts.report_lib.soak_inputs import SOAK_QUESTIONS, interleave
from voice.think.dialogue import Dialogue, DialogueConfig
from voice.think.spoken import SPOKEN_RULES, SPOKEN_SYSTEM_PROMPT

# What the ASR hears in the soak's recordings (pocketsphinx cards, alsa channel names), in the soak's order.
RECORDED_TEXTS = (
    "Ten of clubs.", "Four queen of clubs.", "Seven of clubs.", "Five five.",
    "Eight of spades, four of clubs, seven of hearts.", "Front center.", "Front left.", "Front right.",
    "Rear center.", "Rear left.", "Rear right.", "Side left.", "Side right.",
)  # fmt: skip


def user_texts(count: int) -> list[str]:
    """The soak's turn order (see report_lib.soak_inputs.soak_turns) as text."""
    return interleave(SOAK_QUESTIONS, RECORDED_TEXTS, count)


def visible(messages: list[ChatMessage], history: str) -> list[ChatMessage]:
    """The ablation: all of the history, only the user's side of it, or none (the newest message only)."""
    if history == "full":
        return messages
    system = [m for m in messages if m.role == "system"]
    rest = [m for m in messages if m.role != "system"]
    if history == "users":
        return system + [m for m in rest if m.role == "user"]
    if history == "last":  # the previous exchange only
        return system + rest[-3:]
    if history == "notes":  # earlier turns as background in the system prompt, then a one-question chat
        said = " ".join(f'{"The user" if m.role == "user" else "You"} said: "{m.content}"' for m in rest[:-1])
        base = system[0].content if system else SPOKEN_SYSTEM_PROMPT
        note = f"{base} Earlier in this conversation: {said}" if said else base
        return [ChatMessage("system", note), rest[-1]]
    return system + rest[-1:]


def converse(
    lm: Any, dialogue: Dialogue, texts: list[str], history: str, max_new_tokens: int, teacher: Any = None
) -> list[dict]:
    """The conversation, answered by the diffusion LM (or, with `teacher`, by the base model's greedy decoding)."""
    turns = []
    options = GenerationOptions(
        max_new_tokens=max_new_tokens, seed=0, system_prompt=SPOKEN_SYSTEM_PROMPT, rules=SPOKEN_RULES
    )
    for index, text in enumerate(texts, 1):
        dialogue.add_user(text)
        messages = visible(dialogue.messages(), history)
        if teacher is not None:
            turns.append(teacher_turn(index, text, lm, teacher, messages, max_new_tokens))
            dialogue.add_assistant(turns[-1]["answer"])
            print(f"{index:>3} teacher {turns[-1]['answer'][:90]!r}", flush=True)
            continue
        started = time.perf_counter()
        drafts = lm.stream_chat(messages, options)
        first = next(drafts)
        first_ms = (time.perf_counter() - started) * 1000
        last = first
        for last in drafts:  # noqa: B007 - the final draft is the answer
            pass
        total_ms = (time.perf_counter() - started) * 1000
        answer = last.committed_text.strip() or last.text.strip()
        dialogue.add_assistant(answer)
        reused = last.cached_prompt_tokens
        refinement = last.refinement
        answer_ids = list(refinement.tokens[: refinement.answer_length]) if refinement is not None else []
        turns.append(
            {
                "turn": index,
                "user": text,
                "answer": answer,
                "prompt_tokens": last.prompt_tokens,
                "reused_tokens": reused,
                "encoded_tokens": last.prompt_tokens - reused,
                "history_messages": len(messages) - 1,
                "first_draft_ms": round(first_ms, 1),
                "answer_ms": round(total_ms, 1),
                "answer_words": len(answer.split()),
                "repeated_3gram_rate": round(repeated_ngram_rate(answer), 3),
                "loop_3gram": has_ngram_loop(answer),
                "non_words": non_words(answer),
                "_prompt_ids": lm.prompt_ids(messages, SPOKEN_SYSTEM_PROMPT),
                "_alone_ids": lm.prompt_ids([ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", text)]),
                "_answer_ids": answer_ids,
            }
        )
        print(f"{index:>3} enc {turns[-1]['encoded_tokens']:>4}/{last.prompt_tokens:<4} {answer[:90]!r}", flush=True)
    return turns


@torch.inference_mode()
def teacher_turn(index: int, text: str, lm: Any, teacher: Any, messages: list, max_new_tokens: int) -> dict:
    """One turn answered by the base model's greedy decoding: what a lossless decoding mode would say."""
    prompt_ids = lm.prompt_ids(messages, SPOKEN_SYSTEM_PROMPT)
    eos = lm.tokenizer.eos_token_id
    started = time.perf_counter()
    out = teacher.generate(
        input_ids=torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=eos, pad_token_id=eos,
    )  # fmt: skip
    answer_ids = out[0, len(prompt_ids) :].tolist()
    answer = lm.tokenizer.decode(answer_ids, skip_special_tokens=True).strip()
    alone = lm.prompt_ids([ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", text)])
    return {
        "turn": index, "user": text, "answer": answer, "prompt_tokens": len(prompt_ids), "reused_tokens": 0,
        "encoded_tokens": len(prompt_ids), "history_messages": len(messages) - 1, "first_draft_ms": 0.0,
        "answer_ms": round((time.perf_counter() - started) * 1000, 1), "answer_words": len(answer.split()),
        "repeated_3gram_rate": round(repeated_ngram_rate(answer), 3), "loop_3gram": has_ngram_loop(answer),
        "non_words": non_words(answer), "_prompt_ids": prompt_ids, "_alone_ids": alone, "_answer_ids": answer_ids,
    }  # fmt: skip


@torch.inference_mode()
def perplexity(teacher: Any, prompt_ids: list[int], answer_ids: list[int]) -> float | None:
    """exp(mean NLL) of the answer's tokens after the prompt, under the base model."""
    if not answer_ids:
        return None
    ids = torch.tensor([prompt_ids + answer_ids])
    logits = teacher(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return math.exp(float(torch.nn.functional.cross_entropy(logits, torch.tensor(answer_ids))))


def soak_rows(path: Path, lm: Any, dialogue: Dialogue) -> list[dict]:
    """A soak's turns with the prompts the server built for them (replayed through `Dialogue`)."""
    rows = []
    for turn in json.loads(path.read_text())["turns"]:
        text, answer = turn["transcript"], turn["answer"]
        if not text.strip():
            continue
        dialogue.add_user(text)
        messages = dialogue.messages()
        dialogue.add_assistant(answer)
        alone = [ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", text)]
        answer_ids = lm.tokenizer.encode(answer, add_special_tokens=False)  # an answer cut at the limit has no EOS
        rows.append(
            {
                "turn": turn["index"], "user": text, "answer": answer, "prompt_tokens": turn["prompt_tokens"] or 0,
                "reused_tokens": 0, "encoded_tokens": turn["prompt_tokens_encoded"] or 0, "first_draft_ms": 0.0,
                "answer_words": len(answer.split()), "repeated_3gram_rate": repeated_ngram_rate(answer),
                "loop_3gram": has_ngram_loop(answer), "non_words": non_words(answer),
                "_prompt_ids": lm.prompt_ids(messages, SPOKEN_SYSTEM_PROMPT), "_alone_ids": lm.prompt_ids(alone),
                "_answer_ids": answer_ids,
            }
        )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--context-chars", type=int, default=DialogueConfig().context_chars)
    parser.add_argument("--keep-after-drop", type=float, default=DialogueConfig().keep_after_drop)
    parser.add_argument(
        "--max-exchanges", type=lambda v: None if v == "none" else int(v), default=DialogueConfig().max_exchanges,
        help="earlier exchanges the model sees ('none': as many as the budget holds)",
    )  # fmt: skip
    parser.add_argument("--history", choices=("full", "users", "last", "notes", "none"), default="full")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the voice session's answer limit")
    parser.add_argument(
        "--decoder", choices=("diffusion", "teacher"), default="diffusion",
        help="teacher: the base model's greedy answers (what a lossless decoding mode gives)",
    )  # fmt: skip
    parser.add_argument("--from-soak", type=Path, help="score the answers of this soak JSON instead of generating")
    parser.add_argument("--perplexity", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    lm = load_default_chat_model()
    dialogue = Dialogue(
        DialogueConfig(
            context_chars=args.context_chars, keep_after_drop=args.keep_after_drop, max_exchanges=args.max_exchanges
        )
    )
    teacher = load_base(torch.float32)[0] if args.perplexity or args.decoder == "teacher" else None
    answerer = teacher if args.decoder == "teacher" else None
    if args.from_soak:
        turns = soak_rows(args.from_soak, lm, dialogue)
    else:
        turns = converse(lm, dialogue, user_texts(args.turns), args.history, args.max_new_tokens, answerer)
    if teacher is not None and args.perplexity:
        for row in turns:
            in_context = perplexity(teacher, row["_prompt_ids"], row["_answer_ids"])
            alone = perplexity(teacher, row["_alone_ids"], row["_answer_ids"])
            row["ppl"] = None if in_context is None else round(in_context, 2)
            row["ppl_question_alone"] = None if alone is None else round(alone, 2)
    for row in turns:
        for key in [k for k in row if k.startswith("_")]:
            del row[key]
    print("| turn | prompt tok | encoded | first draft ms | words | rep-3gram | ppl | ppl alone | answer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in turns:
        print(
            f"| {r['turn']} | {r['prompt_tokens']} | {r['encoded_tokens']} | {r['first_draft_ms']:.0f} | "
            f"{r['answer_words']} | {r['repeated_3gram_rate']:.2f} | {r.get('ppl', '–')} | "
            f"{r.get('ppl_question_alone', '–')} | {r['answer'][:70]} |"
        )
    summary = summarise(turns)
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        command = "python scripts/bench/bench_dialogue.py " + " ".join(sys.argv[1:] if argv is None else argv)
        args.json.write_text(json.dumps({"command": command, "summary": summary, "turns": turns}, indent=1) + "\n")
    return 0


def summarise(turns: list[dict]) -> dict[str, Any]:
    """First ten turns against the last ten: encoded tokens, time to first draft, quality."""

    def stats(rows: list[dict]) -> dict[str, Any]:
        ppl = [r["ppl"] for r in rows if r.get("ppl") is not None]
        return {
            "encoded_tokens_median": statistics.median(r["encoded_tokens"] for r in rows),
            "first_draft_ms_p50": round(statistics.median(r["first_draft_ms"] for r in rows), 1),
            "repeated_3gram_rate_mean": round(statistics.fmean(r["repeated_3gram_rate"] for r in rows), 3),
            "loops": sum(r["loop_3gram"] for r in rows),
            "non_words": sum(len(r["non_words"]) for r in rows),
            "ppl_median": round(statistics.median(ppl), 2) if ppl else None,
        }

    return {"first_10": stats(turns[:10]), "last_10": stats(turns[-10:]), "all": stats(turns)}


if __name__ == "__main__":
    sys.exit(main())
