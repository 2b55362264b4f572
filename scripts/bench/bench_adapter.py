"""A GGUF model with its draft adapter (`dlm adapt`): self-speculative against autoregressive decoding, same weights.

    python scripts/bench/bench_adapter.py --model FILE.gguf --adapter DIR [--prompts 12] [--threads 1]

Both modes answer held-out chit-chat prompts (tests/data/heldout_prompts.txt, past the ones `dlm adapt` measures
acceptance on) under the voice system prompt, alternated prompt by prompt so that both see the same load; it prints
tokens/s of each, tokens a pass, and how many answers are the same token for token (they should all be).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's model/, voice/, web/

from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.chat.spec import DecodingSettings, ModelSpec
from model.loading import load_chat_model
from model.training.adapt import TEACHER_SYSTEM_PROMPT

HELDOUT = Path(__file__).resolve().parents[2] / "tests" / "data" / "heldout_prompts.txt"
SKIPPED = 16  # the held-out prompts `dlm adapt` may measure acceptance on (its --heldout default)


def run(chat: DiffusionChatModel, text: str, length: int) -> tuple[list[int], int, float]:
    """(answer tokens, passes, seconds)."""
    messages = [ChatMessage("system", TEACHER_SYSTEM_PROMPT), ChatMessage("user", text)]
    started = time.perf_counter()
    last = list(chat.stream_chat(messages, GenerationOptions(max_new_tokens=length)))[-1]
    seconds = time.perf_counter() - started
    assert last.refinement is not None
    return list(last.refinement.tokens[: last.completion_tokens]), last.step + 1, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--adapter", default=None, help="default: the one beside the file")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = ModelSpec(source=args.model, adapter=args.adapter, device="cpu")
    if spec.draft_adapter is None:
        print("bench_adapter: no draft adapter for this model", file=sys.stderr)
        return 2
    drafting = load_chat_model(spec)
    plain = load_chat_model(ModelSpec(source=args.model, adapter=args.adapter, device="cpu",
                                      decoding=DecodingSettings(decoding="autoregressive")))
    assert isinstance(drafting, DiffusionChatModel) and isinstance(plain, DiffusionChatModel)
    prompts = HELDOUT.read_text().splitlines()[SKIPPED : SKIPPED + args.prompts]
    for chat in (drafting, plain):  # warm-up: kernels, caches, the draft policy's first costs
        run(chat, prompts[0], 8)
    totals = {"self-speculative": [0, 0, 0.0], "autoregressive": [0, 0, 0.0]}
    same = 0
    for text in prompts:
        answers = []
        for mode, chat in (("self-speculative", drafting), ("autoregressive", plain)):
            tokens, passes, seconds = run(chat, text, args.max_new_tokens)
            totals[mode][0] += len(tokens)
            totals[mode][1] += passes
            totals[mode][2] += seconds
            answers.append(tokens)
        same += answers[0] == answers[1]
    print(drafting.note)
    for mode, (tokens, passes, seconds) in totals.items():
        print(f"{mode}: {tokens} tokens in {passes} passes, {seconds:.1f} s: {tokens / seconds:.1f} tokens/s, "
              f"{tokens / passes:.2f} tokens/pass")
    speed = [totals[m][0] / totals[m][2] for m in totals]
    print(f"self-speculative / autoregressive: {speed[0] / speed[1]:.2f}x; {same}/{len(prompts)} answers identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
