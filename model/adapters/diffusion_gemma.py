"""DiffusionGemma (transformers' `diffusion_gemma`) as a stream of `Refinement`s.

DiffusionGemma is a uniform-noise block-diffusion model: each canvas of `canvas_length` tokens starts as random tokens
and is refined by an entropy-bounded sampler that accepts and renoises tokens on its own schedule. It has no mask
token, so the masked sampler (model/decoding/sampler.py) cannot drive it. Instead its own `generate` runs in a worker
thread
with a streamer: `put_draft` receives the argmax canvas of every denoising step (one pass) and `put` each accepted
canvas (one block). Each pass becomes a Refinement whose finished blocks are committed and whose active canvas is not:
a canvas is final only when its block is accepted.

Confidence: the streamer hands over only the argmax canvas; the probabilities would need the full logits copied off
the device every step (256 x 262k floats for the released model), so draft positions report confidence 0.0 and
accepted blocks 1.0. Temperature follows the model's own t_max -> t_min schedule (GenerationOptions.temperature is
not used). A seed seeds torch's global generator for this answer, which DiffusionGemma's sampler draws from.
Cancel is checked at every pass: the streamer raises inside `generate`, which stops the worker after that pass.
However `generate` ends (returns, is cancelled, raises anything at all), the worker puts exactly one final event on
the queue, and the consumer re-raises the worker's exception: a consumer never waits forever with the model's lock.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from model.adapters.masked_lm import end_ids
from model.chat.backend import AnswerPlan, OneAtATime
from model.chat.engine import DiffusionChatModel, context_length_of
from model.chat.spec import ModelSpec
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig
from model.errors import ModelError


class _Cancelled(Exception):
    """Raised from the streamer to unwind DiffusionGemma's generate loop between passes."""


class _QueueStreamer(BaseStreamer):
    """Forwards every draft canvas and accepted canvas to a queue; raises when the answer is cancelled."""

    def __init__(self, events: queue.Queue[tuple[str, Any]], *stops: threading.Event | None) -> None:
        self.events = events
        self.stops = [event for event in stops if event is not None]
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate first echoes the prompt
            self.prompt_seen = True
            return
        self.events.put(("block", value[0].tolist()))

    def put_draft(self, value: torch.Tensor) -> None:
        self.events.put(("draft", value[0].tolist()))
        if any(event.is_set() for event in self.stops):
            raise _Cancelled

    def end(self) -> None:
        """Nothing: the worker reports how `generate` ended (returned, cancelled or raised) once it has."""


def diffusion_gemma_refinements(
    model: torch.nn.Module,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_ids: frozenset[int],
    cancel: threading.Event | None = None,
    seed: int | None = None,
    max_denoising_steps: int | None = None,
) -> Iterator[Refinement]:
    """Run `model.generate` in a worker thread and yield one Refinement per denoising step (see module docstring)."""
    if not prompt_ids:
        raise ModelError("the prompt is empty: a diffusion LM needs at least one prompt token to condition on")
    canvas_length = int(model.config.canvas_length)
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    stop = threading.Event()  # set when the consumer walks away before the end
    streamer = _QueueStreamer(events, stop, cancel)
    kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "streamer": streamer}
    if max_denoising_steps is not None:
        kwargs["max_denoising_steps"] = max_denoising_steps

    def work() -> None:
        # Exactly one final event, whatever happens: the consumer holds the model's lock while it waits for it.
        outcome: tuple[str, Any] = ("end", None)
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                if seed is not None:
                    torch.manual_seed(seed)
                device = next(model.parameters()).device
                model.generate(torch.tensor([prompt_ids], device=device), **kwargs)
        except _Cancelled:
            outcome = ("cancelled", None)
        except BaseException as error:  # every failure is the consumer's to report (it is re-raised there)
            outcome = ("error", error)
        finally:
            events.put(outcome)

    worker = threading.Thread(target=work, name="diffusion-gemma-generate", daemon=True)
    worker.start()
    accepted: list[int] = []
    draft: list[int] = []
    step, last_time = 0, time.perf_counter()

    def refinement(reason: str | None) -> Refinement:
        tokens = accepted + draft
        done = len(accepted)
        return Refinement(
            step=step,
            block=(len(tokens) - 1) // canvas_length,
            tokens=tuple(tokens),
            committed=(True,) * done + (False,) * len(draft),
            confidence=(1.0,) * done + (0.0,) * len(draft),
            elapsed_s=time.perf_counter() - last_time,
            done=reason is not None,
            finish_reason=reason,
            eos_ids=eos_ids,
        )

    try:
        while True:
            kind, payload = events.get()
            if kind == "draft":
                draft = payload
                yield refinement(None)
                step, last_time = step + 1, time.perf_counter()
            elif kind == "block":
                accepted.extend(payload)
                draft = []
            elif kind == "end":
                yield refinement("stop" if any(token in eos_ids for token in accepted) else "length")
                return
            elif kind == "cancelled":
                yield refinement("cancelled")
                return
            else:  # the worker's own exception: a ModelError stays a refusal, anything else is a crash
                raise payload
    finally:
        stop.set()  # a consumer that stops early must not leave the model busy behind the lock
        worker.join()


def diffusion_gemma_chat_model(name: str, tokenizer: Any, model: torch.nn.Module, system_prompt: str | None = None,
                               max_denoising_steps: int | None = None) -> DiffusionChatModel:
    """DiffusionGemma behind `ChatModel`: prompt formatting and drafts as for masked models, passes from its generate,
    one answer at a time.

    The sampler's `block_length` is the model's canvas length (answers are rounded up to whole canvases) and its
    `steps_per_block` the max_denoising_steps; the other sampler fields do not apply to this model.
    """
    canvas = int(model.config.canvas_length)
    steps = min(max_denoising_steps or canvas, canvas)
    model = model.eval()
    eos = end_ids(tokenizer, getattr(model.config, "text_config", model.config))

    def passes(plan: AnswerPlan, cancel: threading.Event | None) -> Iterator[Refinement]:
        return diffusion_gemma_refinements(model, plan.prompt, plan.length, eos, cancel, plan.options.seed,
                                           max_denoising_steps)

    def check(config: SamplerConfig) -> None:
        """Its own sampler decodes by diffusion whatever the config says."""

    backend = OneAtATime(passes, check, constrains=False)  # its own sampler knows no grammar
    sampler = SamplerConfig(block_length=canvas, steps_per_block=steps)
    return DiffusionChatModel(name, tokenizer, backend, sampler, system_prompt, context_length_of(model.config))


def load_diffusion_gemma(source: str, device: torch.device, spec: ModelSpec) -> DiffusionChatModel:
    """DiffusionGemma from a local folder or hub id. `spec.decoding.steps_per_block` maps to max_denoising_steps."""
    from transformers import AutoConfig, AutoTokenizer, DiffusionGemmaForBlockDiffusion

    settings = spec.decoding
    unsupported = set(settings.changed) - {"steps_per_block", "block_length"}
    if unsupported:
        raise ModelError(f"DiffusionGemma has its own sampler; these options do not apply: {sorted(unsupported)}")
    try:
        canvas = int(AutoConfig.from_pretrained(source).canvas_length)
        if settings.block_length not in (None, canvas):  # refused before the weights are loaded
            raise ModelError(
                f"block length {settings.block_length} does not match {source!r}, whose blocks (canvas_length) are "
                f"{canvas} tokens: leave --block-length unset or pass {canvas}"
            )
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(source, dtype=torch.bfloat16)
    except (OSError, ValueError, KeyError, AttributeError) as error:
        raise ModelError(f"could not load DiffusionGemma from {source!r}: {error}") from error
    return diffusion_gemma_chat_model(source.rstrip("/").split("/")[-1], tokenizer, model.to(device),
                                      spec.system_prompt, settings.steps_per_block)
