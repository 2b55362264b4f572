"""`dlm adapt MODEL --out DIR`: a draft adapter for a user's GGUF, trained by the bundled adapter's recipe.

The teacher is the file itself, de-quantized (`load_dense_teacher`): its own chat template, greedy answers to the
project's training prompts (the assistant-style questions and chit-chat of model/training/teacher_data.py) under the
voice system prompt, appended to DIR/teacher.jsonl; then the gated block-diffusion adapter (model/bundled/
block_diffusion.py) trains on them with the drafting objective (model/training/recipe.py), checkpointing to
DIR/checkpoint.pt. Run it again to go on where it stopped. Every run ends by writing DIR/adapter.safetensors and
DIR/adapter.json, whose `teacher` names the model's shape (model/gguf/draft_adapter.py) and whose `acceptance` holds
the drafts' acceptance by position on held-out prompts before training and now.

Answers cut at `max_new_tokens` are kept, cut to whole drafting blocks: a chatty model's answers then still teach
drafting, and no EOS is taught where the teacher wrote none.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from model.adapters.gguf_model import load_dense_teacher
from model.bundled.block_diffusion import AdapterConfig, BlockDiffusionLM, save_adapter
from model.device import resolve_device
from model.errors import ModelError
from model.gguf.draft_adapter import teacher_shape
from model.gguf.header import GGUFHeader
from model.training.recipe import Pair, Progress, ends_with, extend_teacher_file, train_adapter
from model.training.settings import AdaptSettings
from model.training.teacher_data import (
    Exchange,
    TeacherExample,
    assistant_questions,
    chitchat_prompts,
    split_prompts,
    teacher_answers,
)

# The voice pipeline's prompt (voice/think/spoken.py's SPOKEN_SYSTEM_PROMPT, which model/ cannot import; a test keeps
# them equal): the answers an adapter drafts are the ones the assistant asks for
TEACHER_SYSTEM_PROMPT = "You are a helpful voice assistant. Reply briefly, in one short sentence."
HELDOUT_POOL = 120  # chit-chat prompts never trained on (the bundled training's split: tests/data/heldout_prompts.txt)


@dataclass(frozen=True, slots=True)
class AdaptResult:
    steps: int
    examples: int  # training pairs
    before: list[float]  # acceptance by draft position before any training
    after: list[float]  # and at the end of this run


def training_prompts(settings: AdaptSettings) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts): `examples` of the assistant questions and the chit-chat prompts the
    bundled training uses, in a fixed mixed order, and `heldout` of its held-out chit-chat."""
    train, heldout = split_prompts(chitchat_prompts(), HELDOUT_POOL, seed=0)
    pool = assistant_questions() + train[: settings.examples]
    random.Random(0).shuffle(pool)
    return pool[: settings.examples], heldout[: settings.heldout]


def training_pair(example: TeacherExample, eos: int, block: int) -> Pair | None:
    """A finished answer as it is; a cut one cut further to whole blocks (None when nothing is left)."""
    if ends_with(example, eos):
        return example.prompt_ids, example.answer_ids
    whole = len(example.answer_ids) // block * block
    return (example.prompt_ids, example.answer_ids[:whole]) if whole else None


def adapt(header: GGUFHeader, out: Path, settings: AdaptSettings, prompts: tuple[Sequence[str], Sequence[str]]
          ) -> AdaptResult:
    """Train (or go on training) the draft adapter of the GGUF `header` describes into `out`; `prompts`: (training,
    held-out) prompts. Raises ModelError."""
    recipe = settings.recipe
    if not recipe.drafting or recipe.draft_masks + 1 != settings.block_length:
        raise ModelError(f"a draft adapter trains with the drafting objective on blocks of {settings.block_length}: "
                         f"{settings.block_length - 1} drafts after a clean token")
    device = resolve_device(settings.device)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(recipe.seed)
    tokenizer, base, _ = load_dense_teacher(header, torch.float32)
    base.to(device)
    eos = int(tokenizer.eos_token_id)

    def answer(texts: Sequence[str], histories: Sequence[Exchange | None]) -> Iterator[TeacherExample]:
        # an iterator: each batch's answers are written as soon as they exist
        return teacher_answers(base, tokenizer, texts, TEACHER_SYSTEM_PROMPT, settings.max_new_tokens,
                               settings.teacher_batch, histories)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True).strip()

    train, heldout = prompts
    answers = extend_teacher_file(out / "teacher.jsonl", train, [], answer, decode, eos, recipe.seed)
    held = extend_teacher_file(out / "heldout.jsonl", heldout, [], answer, decode, eos, recipe.seed)
    block = settings.block_length
    pairs = [p for p in (training_pair(ex, eos, block) for ex in answers) if p is not None]
    held_pairs = [p for p in (training_pair(ex, eos, block) for ex in held) if p is not None]
    if not pairs:
        raise ModelError("the teacher wrote no answer of a whole block: nothing to train on")

    model = BlockDiffusionLM(base, AdapterConfig(block_length=block, lora_rank=settings.rank))
    model.to(device)
    progress = train_adapter(model, pairs, recipe, out, eos, held_pairs, device)
    return _publish(model, header, out, settings, progress, len(pairs))


def _publish(model: BlockDiffusionLM, header: GGUFHeader, out: Path, settings: AdaptSettings, progress: Progress,
             examples: int) -> AdaptResult:
    """adapter.safetensors and adapter.json in `out`, from the model as it is now."""
    measured = progress.acceptance or []
    before = list(measured[0]["acceptance"]) if measured else []  # type: ignore[call-overload]
    after = list(measured[-1]["acceptance"]) if measured else []  # type: ignore[call-overload]
    recent = (progress.history or [])[-100:]
    save_adapter(model, out, extra={
        "teacher": teacher_shape(header),
        "base": f"{header.path.name} ({header.describe()}), de-quantized; the LoRA decodes on its own blocks",
        "training": {
            "steps": progress.step, "examples": examples, "max_new_tokens": settings.max_new_tokens,
            "teacher_system_prompt": TEACHER_SYSTEM_PROMPT, "recipe": asdict(settings.recipe),
            "final_loss": sum(h["loss"] for h in recent) / max(1, len(recent)),
            "final_masked_accuracy": sum(h["acc"] for h in recent) / max(1, len(recent)),
        },
        "acceptance": {"heldout_prompts": settings.heldout, "by_step": measured},
        "sampler": {"block_length": settings.block_length, "draft_masks": settings.recipe.draft_masks},
    })
    return AdaptResult(progress.step, examples, before, after)
