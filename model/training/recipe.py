"""The recipe the bundled adapter was trained by, as one resumable loop that both trainings run: the bundled model's
(scripts/train/train_default_model.py) and a user's GGUF (`dlm adapt`, model/training/adapt.py).

Both stages append to an output folder and pick up where they stopped: the teacher's answers go to `teacher.jsonl`
a line at a time (`extend_teacher_file`), the adapter and its optimizer to `checkpoint.pt` every `save_every` steps
(`train_adapter`). What the loop measures besides the loss is the drafts' acceptance by position (`draft_acceptance`):
what self-speculative decoding gains from the adapter.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from tqdm import tqdm

from model.bundled.block_diffusion import BlockDiffusionLM
from model.training.block_training import Batch, batch_logits, block_diffusion_loss, make_batch
from model.training.settings import Recipe
from model.training.teacher_data import Exchange, TeacherExample, example_row, load_examples

Pair = tuple[list[int], list[int]]  # (prompt ids, teacher answer ids ending with EOS)
# answers the teacher writes for these prompts, each after the exchange it follows (None: a first turn)
Answerer = Callable[[Sequence[str], Sequence[Exchange | None]], Iterable[TeacherExample]]


def use_bf16(recipe: Recipe, device: torch.device) -> bool:
    """Whether steps run under bf16 autocast: as the recipe says, else on a GPU and on CPUs with native bf16 (AVX-512
    BF16, AMX), where it is ~1.7x faster than fp32; an AVX2-only CPU emulates bf16 matmuls, and a step of the
    SmolLM2 recipe took minutes instead of seconds."""
    if recipe.bf16 is not None:
        return recipe.bf16
    return device.type == "cuda" or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def learning_rate(step: int, recipe: Recipe) -> float:
    """30 warm-up steps, then a cosine down to a tenth over `max_steps`."""
    warmup = 30
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, recipe.max_steps - warmup))
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def ends_with(example: TeacherExample, eos: int) -> bool:
    """Whether the teacher finished this answer (it ends with EOS) rather than being cut at its token budget."""
    return bool(example.answer_ids) and example.answer_ids[-1] == eos


def extend_teacher_file(
    path: Path, first: Sequence[str], follow: Sequence[str], answer: Answerer, decode: Callable[[list[int]], str],
    eos: int, seed: int, write_missing: bool = True,
) -> list[TeacherExample]:
    """Every answer of the plan, in order: those already in `path` (a teacher.jsonl), then the missing ones, written
    by `answer` and appended a line at a time (an interrupted run loses at most the answer being written).

    `first`: first turns; `follow`: prompts that each come after an exchange drawn (with `seed`) from the finished
    first turns, as a voice session shows the model its previous exchange (`decode`: an answer's text). Returns every
    answer, finished or cut at the teacher's budget; `write_missing` False: only those already written."""
    done = load_examples(path) if path.exists() else []
    todo_first, todo_follow = first[len(done):], follow[max(0, len(done) - len(first)):]
    if (todo_first or todo_follow) and write_missing:
        bar = tqdm(total=len(first) + len(follow), initial=len(done), desc="teacher answers")
        with path.open("a") as f, bar:

            def write(examples: Iterable[TeacherExample]) -> None:
                for example in examples:
                    f.write(json.dumps(example_row(example)) + "\n")
                    f.flush()
                    done.append(example)
                    bar.update(1)

            write(answer(todo_first, [None] * len(todo_first)))
            finished = [ex for ex in done[: len(first)] if ends_with(ex, eos)]
            rng = random.Random(seed)
            draws = [rng.choice(finished) for _ in follow][len(follow) - len(todo_follow):] if finished else []
            histories = [(ex.prompt, decode(ex.answer_ids)) for ex in draws]
            write(answer(todo_follow[: len(histories)], histories))
    return done


@torch.no_grad()
def draft_acceptance(model: BlockDiffusionLM, pairs: Sequence[Pair], recipe: Recipe, eos: int) -> list[float]:
    """How often the `draft_masks` drafts after a correct token match the teacher's answer, by position: the j-th
    counts only when every draft before it matched, as self-speculative decoding accepts them. Teacher-forced over
    the held-out `pairs` (every block of each answer at one fixed offset), with the model as it is now."""
    if not recipe.drafting:
        raise ValueError("acceptance of drafts needs the drafting objective")
    was_training = model.training
    model.eval()
    block = recipe.block(model.config.block_length)
    generator = torch.Generator().manual_seed(0)
    batch = _on(make_batch(pairs, block, model.mask_id, eos, 1, generator, drafting=True), model.mask_embedding.device)
    logits = batch_logits(model, batch)
    model.train(was_training)
    right = ((logits.argmax(-1) == batch.targets) & (batch.targets != -100)).cpu()
    supervised = (batch.targets != -100).tolist()
    accepted, total = [0] * recipe.draft_masks, 0
    for row, marks in enumerate(supervised):
        run: list[int] = []  # a block's drafts: consecutive supervised rows
        for column, mark in enumerate([*marks, False]):
            if mark:
                run.append(column)
                continue
            if len(run) == recipe.draft_masks:  # a whole block (an answer's shifted first one is shorter)
                total += 1
                for position, index in enumerate(run):
                    if not right[row, index]:
                        break
                    accepted[position] += 1
            run = []
    return [count / max(1, total) for count in accepted]


def describe_acceptance(acceptance: Sequence[float]) -> str:
    return "/".join(f"{a:.2f}" for a in acceptance)


@dataclass
class Progress:
    """What a training run has done, kept in its checkpoint."""

    step: int = 0
    history: list[dict[str, float]] | None = None  # per step: loss, masked-token accuracy
    acceptance: list[dict[str, object]] | None = None  # per measurement: step, acceptance by draft position


def train_adapter(
    model: BlockDiffusionLM,
    pairs: Sequence[Pair],
    recipe: Recipe,
    out: Path,
    eos: int,
    heldout: Sequence[Pair] = (),
    device: torch.device | None = None,
    on_save: Callable[[Progress], None] | None = None,
) -> Progress:
    """Train `model`'s adapter on `pairs` until `recipe.max_steps` or `recipe.minutes`, resuming from (and saving
    to) `out/checkpoint.pt`. With `heldout` pairs, the drafts' acceptance on them is measured at the start and every
    `eval_every` steps, shown on the progress bar and kept in the checkpoint."""
    device = device or torch.device("cpu")
    optimizer = torch.optim.AdamW(list(model.trainable_parameters()), lr=recipe.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(recipe.seed)
    progress = Progress(0, [], [])
    checkpoint = out / "checkpoint.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False, map_location=device)
        model.load_adapter_state(state["adapter"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        progress = Progress(state["step"], state["history"], state.get("acceptance", []))
        print(f"resumed from step {progress.step}")
    history, measured = progress.history or [], progress.acceptance or []
    progress.history, progress.acceptance = history, measured

    def save() -> None:
        state = {"adapter": model.adapter_state(), "optimizer": optimizer.state_dict(),
                 "generator": generator.get_state(), "step": progress.step, "history": history,
                 "acceptance": measured, "recipe": asdict(recipe)}
        torch.save(state, checkpoint.with_suffix(".tmp"))
        checkpoint.with_suffix(".tmp").replace(checkpoint)
        if on_save is not None:
            on_save(progress)

    def measure() -> str:
        if not heldout or not recipe.drafting:
            return ""
        acceptance = draft_acceptance(model, heldout, recipe, eos)
        if not measured or measured[-1]["step"] != progress.step:
            measured.append({"step": progress.step, "acceptance": acceptance})
        return describe_acceptance(acceptance)

    model.train()
    block = recipe.block(model.config.block_length)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16(recipe, device))
    deadline = time.monotonic() + recipe.minutes * 60
    order = random.Random(recipe.seed + progress.step)
    first_step, started, seen = progress.step, time.monotonic(), 0.0
    accepted = measure()
    bar = tqdm(total=recipe.max_steps, initial=progress.step, desc="train")
    while progress.step < recipe.max_steps and time.monotonic() < deadline:
        batch = make_batch(order.sample(list(pairs), min(recipe.batch, len(pairs))), block, model.mask_id, eos,
                           recipe.copies, generator, drafting=recipe.drafting, near_weight=recipe.near_weight)
        batch = _on(batch, device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(progress.step, recipe)
        with autocast:
            loss, stats = block_diffusion_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.trainable_parameters()), 1.0)
        optimizer.step()
        progress.step += 1
        seen += batch.clean_ids.numel() + batch.noisy_ids.numel()
        history.append({"step": progress.step, "loss": stats["loss"], "acc": stats["acc"]})
        if progress.step % recipe.eval_every == 0:
            accepted = measure()
        recent = history[-50:]
        bar.set_postfix(loss=f"{sum(h['loss'] for h in recent) / len(recent):.3f}",
                        acc=f"{sum(h['acc'] for h in recent) / len(recent):.3f}",
                        accepted=accepted or "-", tok_s=f"{seen / (time.monotonic() - started):.0f}")
        bar.update(1)
        if progress.step % recipe.save_every == 0:
            save()
    bar.close()
    if progress.step > first_step:  # an export alone leaves the checkpoint (perhaps a running training's) untouched
        measure()
        save()
    return progress


def _on(batch: Batch, device: torch.device) -> Batch:
    """`batch` with every tensor on `device` (made on the host: its masks are drawn from a CPU generator)."""
    if device.type == "cpu":
        return batch
    return replace(batch, **{f.name: getattr(batch, f.name).to(device) for f in fields(batch)})
