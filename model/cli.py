"""`dlm generate "prompt"`: watch a diffusion LM write its answer, pass by pass, in the terminal; `dlm adapt MODEL
--out DIR`: train a draft adapter for a GGUF model (model/training/adapt.py).

On a terminal the answer is redrawn in place after every pass: committed text in normal weight, guesses that may still
change dim and underlined. Piped output gets one plain line per pass with guesses shown as underscores. At the end it
prints tokens/s and tokens committed per pass.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TextIO

from model.chat import ChatMessage, Draft, GenerationOptions
from model.chat.spec import WEIGHTS as WEIGHT_CHOICES
from model.chat.spec import DecodingSettings, ModelSpec, add_model_options
from model.decoding.sampler import DECODING_MODES
from model.device import DEVICE_CHOICES
from model.errors import ModelError
from model.training.settings import AdaptSettings, DrafterSettings

DIM_UNDERLINE = "\033[2;4m"
RESET = "\033[0m"


def render_plain(draft: Draft) -> str:
    """Committed text as is, guesses as underscores (spaces kept) so the shape of the draft is visible."""
    parts = [
        piece.text if piece.committed else "".join(" " if ch.isspace() else "_" for ch in piece.text)
        for piece in draft.pieces
    ]
    return "".join(parts).replace("\n", " ")


def render_ansi(draft: Draft) -> str:
    return "".join(piece.text if piece.committed else f"{DIM_UNDERLINE}{piece.text}{RESET}" for piece in draft.pieces)


class LiveView:
    """Redraws the draft in place on a TTY (cursor up over the lines drawn last time), or appends plain lines."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out = out
        self.tty = tty
        self.lines_drawn = 0  # screen lines the last draft took; the cursor is left on the last of them

    def show(self, draft: Draft) -> None:
        if not self.tty:
            self.out.write(f"pass {draft.step:3d} | {render_plain(draft)}\n")
            self.out.flush()
            return
        width = max(shutil.get_terminal_size().columns, 20)
        if self.lines_drawn > 1:
            self.out.write(f"\033[{self.lines_drawn - 1}F")  # back to the first line of the previous draft
        self.out.write("\r\033[J" + render_ansi(draft))  # clear from there to the end of the screen, then draw
        self.out.flush()
        self.lines_drawn = sum(max(1, -(-len(line) // width)) for line in draft.text.split("\n"))

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dlm", description="Run a local diffusion language model.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="answer one prompt, showing every refinement pass")
    gen.add_argument("prompt")
    add_model_options(gen)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--block-length", type=int, default=None, help="tokens per block (default: the model's)")
    gen.add_argument("--steps", type=int, default=None, help="pass budget per block (default: block length)")
    gen.add_argument("--threshold", type=float, default=None, help="confidence threshold for parallel commits")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--no-cache", action="store_true", help="re-encode the prompt on every pass")
    gen.add_argument("--decoding", choices=DECODING_MODES, default=None,
                     help="self-speculative (default for the bundled model: the teacher's exact answer, several tokens"
                          " a pass), autoregressive (one token a pass) or diffusion (threshold parallel decoding)")
    gen.add_argument("--draft-masks", type=int, default=None, help="self-speculative: tokens drafted ahead per pass")
    gen.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                     help="where the model runs (auto: a CUDA GPU when torch sees one, else the CPU)")
    gen.add_argument("--weights", choices=WEIGHT_CHOICES, default="auto",
                     help="the bundled model's: int4 (the GGUF's own blocks, default on a CPU) or bf16")
    add_adapt_parser(commands)
    return parser.parse_args(argv)


def add_adapt_parser(commands: argparse._SubParsersAction) -> None:
    """`dlm adapt`, its defaults `AdaptSettings`' and `Recipe`'s, or `DrafterSettings`' with --drafter
    (model/training/settings.py: no torch, so that the flags are checked before anything heavy is imported)."""
    lora, drafter = AdaptSettings(), DrafterSettings()
    recipe = lora.recipe
    adapt = commands.add_parser(
        "adapt", help="train a draft adapter for a GGUF model, so that it decodes self-speculatively",
        description="Train a draft adapter for MODEL on its own greedy answers to the project's training prompts "
        "(resumable: run it again to go on): the gated block-diffusion LoRA (adapter.safetensors, adapter.json), or "
        "with --drafter a one-layer drafter on the model's own hidden rows (drafter.safetensors, drafter.json), into "
        "--out. Keep the folder beside the file as FILE.gguf.dlm-adapter/ to have it found, or pass it with "
        "--adapter.")
    adapt.add_argument("model", help="a GGUF: FILE.gguf, ollama:NAME[:TAG], or a folder holding one .gguf")
    adapt.add_argument("--out", required=True, help="the adapter's folder (also holds the teacher's answers and the "
                       "checkpoint a later run resumes from)")
    adapt.add_argument("--drafter", action="store_true",
                       help="train a drafter on the model's hidden rows (a sliver of a pass a draft) instead of the "
                       "LoRA; it needs the decode kernel (a CPU, the file's block types)")

    def both(flag: str, kind: type, lora_default: object, drafter_default: object, words: str) -> None:
        adapt.add_argument(flag, type=kind, default=None,
                           help=f"{words} (default {lora_default}; with --drafter {drafter_default})")

    both("--minutes", float, recipe.minutes, drafter.minutes, "stop training after this many minutes (this run)")
    both("--max-steps", int, recipe.max_steps, drafter.steps,
         "training steps in all (the learning rate schedule's length)")
    both("--batch", int, recipe.batch, drafter.batch, "answers a training step")
    both("--lr", float, recipe.lr, drafter.lr, "learning rate")
    both("--eval-every", int, recipe.eval_every, drafter.eval_every,
         "steps between measurements of the drafts' acceptance")
    adapt.add_argument("--examples", type=int, default=lora.examples, help="training prompts the teacher answers")
    adapt.add_argument("--heldout", type=int, default=lora.heldout,
                       help="held-out prompts the drafts' acceptance is measured on")
    adapt.add_argument("--max-new-tokens", type=int, default=lora.max_new_tokens,
                       help="the teacher's answer budget")
    adapt.add_argument("--shortlist", type=int, default=drafter.shortlist,
                       help="--drafter: the tokens its head scores (those the answers use most)")
    adapt.add_argument("--device", choices=DEVICE_CHOICES, default=lora.device,
                       help="where the LoRA trains (cuda: a GPU, minutes instead of hours); a drafter trains on the "
                       "CPU")


def adapt_command(args: argparse.Namespace, out: TextIO) -> None:
    from pathlib import Path

    from model.gguf.draft_adapter import beside
    from model.gguf.locate import open_gguf
    from model.training.adapt import adapt, training_prompts
    from model.training.recipe import describe_acceptance

    header = open_gguf(args.model)
    if header is None:
        raise ModelError(f"dlm adapt takes a GGUF model, not {args.model!r}")
    folder = Path(args.out)
    lora = AdaptSettings(examples=args.examples, heldout=args.heldout, max_new_tokens=args.max_new_tokens,
                         device=args.device)
    if args.drafter:
        from model.training.adapt_drafter import adapt_drafter

        chosen = {"minutes": args.minutes, "steps": args.max_steps, "batch": args.batch, "lr": args.lr,
                  "eval_every": args.eval_every}
        drafting = replace(DrafterSettings(), examples=args.examples, heldout=args.heldout,
                           max_new_tokens=args.max_new_tokens, shortlist=args.shortlist,
                           **{name: value for name, value in chosen.items() if value is not None})
        drafted = adapt_drafter(header, folder, drafting, training_prompts(lora))
        what, steps, examples, before, after = "drafter", drafted.steps, drafted.examples, drafted.before, drafted.after
        took = f" in {drafted.seconds / 60:.1f} minutes"
    else:
        chosen = {"minutes": args.minutes, "max_steps": args.max_steps, "batch": args.batch, "lr": args.lr,
                  "eval_every": args.eval_every}
        recipe = replace(lora.recipe, **{name: value for name, value in chosen.items() if value is not None})
        result = adapt(header, folder, replace(lora, recipe=recipe), training_prompts(lora))
        what, steps, examples, before, after = "adapter", result.steps, result.examples, result.before, result.after
        took = ""
    out.write(f"{what} after {steps} steps on {examples} answers written to {folder}{took}\n"
              f"drafts accepted by position on {args.heldout} held-out prompts: before "
              f"{describe_acceptance(before)}, now {describe_acceptance(after)}\n"
              f"use it with --adapter {folder}, or keep it beside the model as {beside(header.path)}\n")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The model to load, from the flags: only what the user set changes the model's own decoding settings."""
    settings = DecodingSettings(
        decoding=args.decoding, threshold=args.threshold, block_length=args.block_length,
        steps_per_block=args.steps, draft_masks=args.draft_masks, use_cache=not args.no_cache,
    )
    return ModelSpec(source=args.model, device=args.device, weights=args.weights, decoding=settings,
                     adapter=args.adapter)


def generate_command(args: argparse.Namespace, spec: ModelSpec, out: TextIO) -> None:
    import torch

    from model.bundled.backend import BlockDiffusionBackend
    from model.chat.engine import DiffusionChatModel
    from model.device import describe, resolve_device
    from model.loading import load_chat_model
    from model.runtime import row_exact

    device = resolve_device(spec.device)
    model = load_chat_model(spec)
    options = GenerationOptions(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    view = LiveView(out, tty=out.isatty())
    started = time.perf_counter()
    last: Draft | None = None
    for draft in model.stream_chat([ChatMessage("user", args.prompt)], options):
        view.show(draft)
        last = draft
    seconds = time.perf_counter() - started
    view.finish()
    if last is None:
        raise ModelError("the model produced no pass")
    passes = last.step + 1
    tokens = last.completion_tokens
    out.write(
        f"{tokens} tokens in {passes} passes, {seconds:.2f} s: {tokens / seconds:.1f} tokens/s, "
        f"{tokens / passes:.2f} tokens/pass ({last.finish_reason}) on {describe(device)}\n"
    )
    if isinstance(model, DiffusionChatModel) and model.note:
        out.write(model.note + "\n")
    if isinstance(model, DiffusionChatModel) and model.sampler.decoding == "self-speculative":
        cpu = device.type == "cpu"
        problem = row_exact.check_here(torch.get_num_threads())
        backend = model.backend
        if problem is None and isinstance(backend, BlockDiffusionBackend) and backend.model.int4 is not None:
            from model.runtime import int4_weights

            problem = int4_weights.check_here(torch.get_num_threads())
        out.write((exactness_note(problem) if cpu else GPU_NOTE) + "\n")


MAY_DIFFER = (
    "the answer can differ from autoregressive decoding where the teacher's two best tokens tie within bf16 rounding"
)
# The row-exact kernels (model/runtime/row_exact.py) were chosen for, and are probed on, CPUs; a GPU's are not probed.
GPU_NOTE = f"not guaranteed exact on a GPU (row-exactness is probed on CPUs only): {MAY_DIFFER}"


def exactness_note(problem: str | None) -> str:
    """What self-speculative decoding guarantees on this CPU, from `row_exact.check_here`."""
    if problem is None:
        return "exact: this answer is the teacher's autoregressive answer bit for bit (row-exact kernels on this CPU)"
    return f"not guaranteed exact on this CPU ({problem}): {MAY_DIFFER}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # built first: a bad --model (a GGUF name that leads nowhere, an unsupported file) stops before any import
        if args.command == "adapt":
            adapt_command(args, sys.stdout)
        else:
            spec = model_spec(args)
            generate_command(args, spec, sys.stdout)
    except ModelError as error:
        print(f"dlm: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
