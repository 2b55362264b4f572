"""`dlm adapt MODEL --out DIR --drafter`: a drafter on a user's GGUF's own hidden rows (model/drafting/), the small
draft model that proposes a block of tokens for a sliver of a pass.

The target is the file as it decodes (its own blocks through the decode kernel, `load_chat_model`): it answers the
training prompts greedily under the voice system prompt, `chunk` prompts in one pass a step, and the residual rows of
its tapped layers are kept (`traced_answers`) in DIR/traced-*.pt, a chunk at a time. Then only the drafter trains on
them: its layer started from the target's last one (de-quantized from the file), its head the target's head rows of
the tokens the answers use most. It checkpoints to DIR/drafter-checkpoint.pt; run the command again to go on where it
stopped (answers already traced are read back, training resumes at its step). Every run ends by writing
DIR/drafter.safetensors and DIR/drafter.json, whose `teacher` names the model's shape (model/gguf/draft_adapter.py)
and whose `acceptance` holds the drafts' acceptance by position on held-out prompts before training and now.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from model.adapters.gguf_model import head_rows
from model.chat import ChatMessage
from model.chat.engine import DiffusionChatModel
from model.chat.spec import ModelSpec
from model.drafting.drafter import Drafter, DrafterConfig, TargetShape, save_drafter
from model.drafting.training import Traced, TrainSettings, acceptance, shortlist_of, traced_answers, train_drafter
from model.errors import ModelError
from model.gguf.draft_adapter import NONE, teacher_shape
from model.gguf.header import GGUFHeader
from model.gguf.network import dense_linears
from model.loading import load_chat_model
from model.training.adapt import TEACHER_SYSTEM_PROMPT
from model.training.settings import DrafterSettings

CHECKPOINT = "drafter-checkpoint.pt"
_DRAFT_LAYER = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "o",
                "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down"}


@dataclass(frozen=True, slots=True)
class DrafterResult:
    steps: int  # training steps in all (this run's and earlier ones')
    examples: int  # traced training answers
    before: list[float]  # acceptance by draft position before any training
    after: list[float]  # and now
    seconds: float  # this run's wall time


def adapt_drafter(header: GGUFHeader, out: Path, settings: DrafterSettings,
                  prompts: tuple[Sequence[str], Sequence[str]]) -> DrafterResult:
    """Trace the target's answers to `prompts` (training, held-out) and train (or go on training) its drafter into
    `out`. Raises ModelError where the decode kernel does not run the file (a drafter reads the rows it computes)."""
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    chat = load_chat_model(ModelSpec(source=str(header.path), adapter=NONE))
    assert isinstance(chat, DiffusionChatModel)
    backend = chat.backend
    if not backend.taps_rows():  # type: ignore[attr-defined]
        raise ModelError(f"a drafter reads {header.path.name}'s hidden rows through the decode kernel, which does not "
                         f"run it here: {chat.note}")
    model = backend.model  # type: ignore[attr-defined]
    fast = model.inference_pass()
    shape = TargetShape.of(model.base.config)
    config = DrafterConfig.for_target(shape, settings.block, settings.shortlist)
    eos = frozenset(backend.eos_ids)  # type: ignore[attr-defined]

    def traced(texts: Sequence[str], name: str) -> list[Traced]:
        answers: list[Traced] = []
        for start in tqdm(range(0, len(texts), settings.chunk), desc=f"target answers ({name})"):
            path = out / f"traced-{name}-{start:05d}.pt"
            if path.exists():
                answers += [Traced(**row) for row in torch.load(path)]
                continue
            ids = [chat.prompt_ids([ChatMessage("system", TEACHER_SYSTEM_PROMPT), ChatMessage("user", text)])
                   for text in texts[start : start + settings.chunk]]
            chunk = traced_answers(fast, ids, config.taps, settings.max_new_tokens, eos)
            torch.save([asdict(t) for t in chunk], path)
            answers += chunk
        return answers

    train, heldout = prompts
    held = traced(heldout, "heldout")
    data = traced(train, "train")
    if not any(len(t.tokens) - t.prompt > 1 for t in data):
        raise ModelError("the target wrote no answer of two tokens or more: nothing to train a drafter on")
    shortlist = shortlist_of(data, config.shortlist, sorted(eos))
    drafter = Drafter(dataclasses.replace(config, shortlist=len(shortlist)), shortlist, head_rows(header)(shortlist))
    last = model.base.model.layers[-1]
    linears = dense_linears(header, shape.layers - 1, torch.float32)
    drafter.init_from_weights({_DRAFT_LAYER[path]: weight for path, weight in linears.items()},
                              last.input_layernorm.weight, last.post_attention_layernorm.weight)
    embedding = model.base.get_input_embeddings()

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return embedding(ids).float()

    training = TrainSettings(steps=settings.steps, batch=min(settings.batch, len(data)), lr=settings.lr,
                             minutes=settings.minutes)
    start, resumed, before = 0, None, None
    checkpoint = out / CHECKPOINT
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        if state["shortlist"] != shortlist.tolist():
            raise ModelError(f"{checkpoint} was trained on other answers: remove it (or the folder) to start again")
        drafter.load_state_dict(state["drafter"])
        start, before = state["step"], state["before"]
        resumed = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=settings.lr,
                                    weight_decay=0.0)
        resumed.load_state_dict(state["optimizer"])
    if before is None:
        before = acceptance(drafter, held, embed)
    measured = list(before)
    step, optimizer = start, resumed
    bar = tqdm(total=settings.steps, initial=start, desc="drafter")
    for step, loss, optimizer in train_drafter(drafter, data, embed, training, start, resumed):
        bar.update(1)
        if step % settings.eval_every == 0:
            measured = acceptance(drafter, held, embed)
            drafter.train()
        bar.set_postfix(loss=f"{loss:.3f}", accepted="/".join(f"{a:.2f}" for a in measured))
        if step % settings.save_every == 0 or step == settings.steps:
            _save_checkpoint(checkpoint, drafter, optimizer, step, before, shortlist)
    bar.close()
    if optimizer is not None:
        _save_checkpoint(checkpoint, drafter, optimizer, step, before, shortlist)
    drafter.eval()
    after = acceptance(drafter, held, embed)
    save_drafter(drafter, out, {
        "teacher": teacher_shape(header),
        "base": f"{header.path.name} ({header.describe()}), its own blocks through the decode kernel",
        "acceptance": {"heldout_prompts": len(held), "before": before, "after": after},
        "examples": len(data), "steps": step, "settings": asdict(settings),
        "teacher_system_prompt": TEACHER_SYSTEM_PROMPT,
    })
    return DrafterResult(step, len(data), before, after, time.monotonic() - started)


def _save_checkpoint(path: Path, drafter: Drafter, optimizer: torch.optim.Optimizer, step: int,
                     before: list[float], shortlist: torch.Tensor) -> None:
    """Written beside and renamed: an interrupted save leaves the previous checkpoint whole."""
    partial = path.with_suffix(".partial")
    torch.save({"drafter": drafter.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "before": before, "shortlist": shortlist.tolist()}, partial)
    partial.replace(path)
