"""Train the bundled model's drafter (model/drafting/) on its own greedy answers (CPU, resumable).

    python scripts/train/train_drafter.py [--out runs/drafter] [--examples 1500] [--steps 1500]

Stages: (1) the target answers the training prompts and the held-out ones greedily through the fast runtime's own
passes, with its tapped hidden rows (OUT/traced-*.pt, a chunk at a time); (2) the drafter (its layer started from the
target's last one) trains on them, and its acceptance by draft position on the held-out answers is printed before
and after; (3) OUT/drafter.safetensors and OUT/drafter.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch
from tqdm import tqdm

from model.bundled.default_model import ADAPTER_DIR, load_default_chat_model
from model.drafting.drafter import Drafter, DrafterConfig, TargetShape, save_drafter
from model.drafting.training import (
    Traced,
    TrainSettings,
    acceptance,
    shortlist_of,
    traced_answers,
    train_drafter,
)
from model.training.teacher_data import assistant_questions, chat_prompt_ids, chitchat_prompts, split_prompts
from voice.think.spoken import SPOKEN_SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parents[2]
HELDOUT_FILE = ROOT / "tests" / "data" / "heldout_prompts.txt"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "drafter")
    p.add_argument("--examples", type=int, default=1500, help="chit-chat prompts beside the assistant questions")
    p.add_argument("--heldout", type=int, default=60, help="held-out prompts acceptance is measured on")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--chunk", type=int, default=32, help="prompts answered together (one pass a step)")
    p.add_argument("--block", type=int, default=4)
    p.add_argument("--shortlist", type=int, default=4096)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--publish", action="store_true",
                   help="also write the drafter beside the bundled adapter (model/bundled/default/), which loads it")
    p.add_argument("--context-from", choices=("answer", "prompt"), default="answer",
                   help="the context a block sees: from the prompt's last token (as decoding gives it) or the whole "
                   "prompt")
    return p.parse_args()


def traced(fast, tokenizer, prompts: list[str], taps, args, name: str, eos: frozenset[int]) -> list[Traced]:
    """Every prompt's traced answer, from OUT/traced-NAME-*.pt where a chunk is already there."""
    out: list[Traced] = []
    for start in tqdm(range(0, len(prompts), args.chunk), desc=f"target answers ({name})"):
        path = args.out / f"traced-{name}-{start:05d}.pt"
        if path.exists():
            out += [Traced(**row) for row in torch.load(path)]
            continue
        ids = [chat_prompt_ids(tokenizer, SPOKEN_SYSTEM_PROMPT, text) for text in prompts[start : start + args.chunk]]
        chunk = traced_answers(fast, ids, taps, args.max_new_tokens, eos)
        torch.save([{"tokens": t.tokens, "prompt": t.prompt, "tapped": t.tapped} for t in chunk], path)
        out += chunk
    return out


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    chat = load_default_chat_model()
    model = chat.backend.model
    fast = model.inference_pass()
    tokenizer = chat.tokenizer
    eos = frozenset({int(tokenizer.eos_token_id)})
    shape = TargetShape.of(model.base.config)
    base_config = DrafterConfig.for_target(shape, args.block, args.shortlist)
    heldout = [line for line in HELDOUT_FILE.read_text().splitlines() if line.strip()][: args.heldout]
    train_pool, _ = split_prompts(chitchat_prompts(), 120, seed=0)
    prompts = assistant_questions() + train_pool[: args.examples]
    held = traced(fast, tokenizer, heldout, base_config.taps, args, "heldout", eos)
    data = traced(fast, tokenizer, prompts, base_config.taps, args, "train", eos)
    print(f"{len(data)} training answers ({sum(len(t.tokens) - t.prompt for t in data)} answer tokens), "
          f"{len(held)} held out")

    table = model.base.get_input_embeddings().weight.detach()
    head = model.base.get_output_embeddings().weight.detach()

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return table[ids].float()

    shortlist = shortlist_of(data, base_config.shortlist, sorted(eos))
    covered = sum(t in set(shortlist.tolist()) for ex in held for t in ex.tokens[ex.prompt:])
    print(f"shortlist of {len(shortlist)}: {covered / sum(len(ex.tokens) - ex.prompt for ex in held):.3f} of the "
          "held-out answers' tokens")
    drafter = Drafter(dataclasses.replace(base_config, shortlist=len(shortlist)), shortlist, head[shortlist])
    drafter.init_from_layer(model.base.model.layers[-1])
    before = acceptance(drafter, held, embed, context_from=args.context_from)
    print("acceptance before:", [round(x, 3) for x in before])
    settings = TrainSettings(steps=args.steps, lr=args.lr, minutes=args.minutes, context_from=args.context_from)
    started = time.monotonic()
    bar = tqdm(total=settings.steps, desc="drafter")
    for step, loss, _ in train_drafter(drafter, data, embed, settings):
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")
        if step % 250 == 0:
            bar.write(f"step {step}: loss {loss:.3f}, acceptance "
                      f"{[round(x, 3) for x in acceptance(drafter, held, embed, context_from=args.context_from)]}")
    bar.close()
    after = acceptance(drafter, held, embed, context_from=args.context_from)
    print("acceptance after:", [round(x, 3) for x in after], f"({time.monotonic() - started:.0f} s of training)")
    meta = {"acceptance": {"before": before, "after": after}, "examples": len(data), "steps": args.steps,
            "context_from": args.context_from}
    save_drafter(drafter, args.out, meta)
    if args.publish:
        save_drafter(drafter, ADAPTER_DIR, meta)


if __name__ == "__main__":
    main()
