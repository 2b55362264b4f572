"""The device check: what the diffusion LM's passes and decoding cost on this machine's GPU (or CPU), as one JSON.

    python scripts/device_check.py --device cuda --json device_check.json    # sized to fit a 10-minute run
    python scripts/device_check.py --device cpu --json device_check_cpu.json # under a minute on 2 cores

What a pass costs depends on the architecture, the size, the dtype and the shapes, not on the weights' values. So when
the bundled model's weights are not here (a GPU machine with no network and no room for them) it times a randomly
initialised Llama of SmolLM2-135M's shape inside the block-diffusion adapter with the bundled adapter's config
(model/bundled/default/adapter.json); when they are (`ensure_base_checkpoint`'s cache), it times the real model. With
random
weights, decoding's tokens/s are the pass rate times a random model's acceptance (about one token a pass): the JSON
says which weights ran (`weights`).

It measures, through the code that serves answers (model/runtime/batching.py, model/runtime/batch_runner.py,
model/decoding/speculative.py,
model/decoding/sampler.py): one batched pass by rows per answer (1: an autoregressive step; 4: the self-speculative
pass, last
token + 3 masks; 16: a pass after 4 drafts with 12 masks) and answers per pass (1, 8, 64); decoding tokens/s in each
mode for 1 and 64 concurrent answers, with the time to each answer's first draft; memory (the GPU's peak, or the
process's peak RSS on a CPU). It imports only torch, transformers, safetensors (through them), numpy, llguidance
(the grammar module, which every back end imports) and `model/`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.bundled.block_diffusion import AdapterConfig, BlockDiffusionLM
from model.bundled.default_model import ADAPTER_DIR, BASE_NAME, DRAFT_MASKS, adapter_meta, load_default_chat_model
from model.chat import ChatMessage
from model.chat.spec import ModelSpec
from model.decoding.block_passes import BlockPasses, DiffusionSequence
from model.decoding.sampler import DiffusionDecoding, SamplerConfig
from model.decoding.speculative import SpeculativeDecoding
from model.decoding.step import DecodingSequence
from model.device import DEVICE_CHOICES, describe, resolve_device, synchronize
from model.disk_cache import cache_root
from model.errors import ModelError
from model.process.threads import set_torch_threads
from model.runtime.batch_runner import BatchRunner, Run
from model.runtime.batching import Feed, SlotCache, batched_pass, prefill
from scripts.report_lib.passes import PassLog
from scripts.report_lib.tiny_models import smollm2_shaped_llama
from voice.think.spoken import SPOKEN_SYSTEM_PROMPT

ROWS = (1, 4, 16)
BATCHES = (1, 8, 64)
DECODING_BATCHES = (1, 64)
MODES = ("autoregressive", "self-speculative", "diffusion")
QUESTION = "What's the weather like on Mars?"  # the bundled model's decoding runs answer this
RANDOM_EOS = frozenset({2})  # SmolLM2's <|im_end|> id; a random model emits it by chance


@dataclass(frozen=True, slots=True)
class Budget:
    """How much to measure: a GPU gets real repeat counts; 2 CPU cores get what fits in a minute."""

    cache_length: int  # tokens cached per answer before the timed passes
    warmup: int  # untimed passes per shape: a GPU's first calls pick kernels, and oneDNN builds a bf16 kernel per
    # shape on its first call (a CPU's first pass of a shape measured several times its later ones)
    repeats: int  # timed passes per shape (the median is reported)
    new_tokens: int  # tokens per answer in the decoding runs

    @classmethod
    def for_device(cls, device: torch.device) -> Budget:
        return cls(256, 3, 20, 64) if device.type == "cuda" else cls(32, 1, 1, 4)


def random_model(device: torch.device) -> BlockDiffusionLM:
    """SmolLM2-135M's architecture with random weights, bf16 base and fp32 adapter as the bundled model loads."""
    base = smollm2_shaped_llama(device)
    for parameter in base.parameters():  # parameters only: the rotary inv_freq buffer stays fp32, as when loaded
        parameter.data = parameter.data.to(torch.bfloat16)
    model = BlockDiffusionLM(base, AdapterConfig.from_json(adapter_meta()["adapter"]))
    model.cast_adapter(torch.float32)
    return model.eval().to(device)


def bundled_weights_here() -> bool:
    folder = cache_root() / BASE_NAME
    return (folder / "model.safetensors").is_file() and (ADAPTER_DIR / "adapter.safetensors").is_file()


@dataclass(frozen=True, slots=True)
class Subject:
    """What is measured: the model, its end-of-answer ids, the prompt its answers continue, which weights."""

    model: BlockDiffusionLM
    eos: frozenset[int]
    prompt: list[int]
    weights: str  # "bundled" or "random"


def build(device: torch.device, force_random: bool, prompt_length: int) -> Subject:
    """The bundled model answering a real question when its weights are here (so self-speculative decoding's
    acceptance is real), else the random stand-in continuing `prompt_length` random tokens."""
    if not force_random and bundled_weights_here():
        chat = load_default_chat_model(ModelSpec(device=str(device)))
        prompt = chat.prompt_ids([ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", QUESTION)])
        return Subject(chat.backend.model, frozenset(chat.backend.eos_ids), prompt, "bundled")
    model = random_model(device)
    return Subject(model, RANDOM_EOS, random_ids(prompt_length + 1, model.vocab_size, seed=3), "random")


def random_ids(count: int, vocab: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (count,), generator=generator).tolist()


@torch.inference_mode()
def copy_slot(cache: SlotCache, source: int, target: int) -> None:
    """Make slot `target` of `cache` hold what slot `source` holds (keys, values and tokens): one prompt encoded once
    for every answer of a shape (64 prefills would not fit a CPU's minute). Serving never copies a slot, so this
    reaches into the cache's buffers here rather than being a method of it."""
    for keys, values in zip(cache._keys, cache._values, strict=True):
        keys[target] = keys[source]
        values[target] = values[source]
    cache.slots[target].ids = list(cache.slots[source].ids)


def timed(device: torch.device, work: Any) -> float:
    synchronize(device)
    started = time.perf_counter()
    work()
    synchronize(device)
    return time.perf_counter() - started


@torch.inference_mode()
def pass_costs(model: BlockDiffusionLM, device: torch.device, budget: Budget) -> dict[str, dict[str, float]]:
    """Median ms of one batched pass per (rows per answer, answers), every answer after `cache_length` cached
    tokens (one prompt encoded once and copied to every slot). Nothing is kept: lengths stay fixed."""
    cache = SlotCache(max(BATCHES))
    prefill(model, cache, 0, random_ids(budget.cache_length, model.vocab_size, seed=1))
    for slot in range(1, max(BATCHES)):
        copy_slot(cache, 0, slot)
    costs: dict[str, dict[str, float]] = {}
    for rows in ROWS:
        feed = Feed((11,), (model.mask_id,) * (rows - 1))
        costs[f"rows={rows}"] = {}
        for batch in BATCHES:
            def one_pass(batch: int = batch, feed: Feed = feed) -> None:
                batched_pass(model, cache, list(range(batch)), [feed] * batch)

            for _ in range(budget.warmup):
                one_pass()
            times = [timed(device, one_pass) for _ in range(budget.repeats)]
            costs[f"rows={rows}"][f"batch={batch}"] = round(statistics.median(times) * 1e3, 3)
    return costs


def sequence(
    mode: str, model: BlockDiffusionLM, eos: frozenset[int], prompt: list[int], length: int
) -> DecodingSequence:
    """One answer's decoding as the bundled back end builds it (model/bundled/backend.py `sequence`), greedy."""
    if mode == "diffusion":
        block = model.config.block_length
        settings = {**adapter_meta().get("sampler", {}), "block_length": block, "steps_per_block": block}
        decoding = DiffusionDecoding(model.mask_id, eos, length, SamplerConfig(**settings))
        return DiffusionSequence(decoding, BlockPasses(prompt, model.vocab_size))
    masks = DRAFT_MASKS if mode == "self-speculative" else 0
    return SpeculativeDecoding(prompt, length, masks, model.mask_id, eos)


def decode(runner: BatchRunner, subject: Subject, mode: str, budget: Budget) -> dict[str, Any]:
    """As many concurrent answers as `runner` has slots, in `mode`, each read by its own thread as concurrent
    callers read them: tokens/s from submitting to the last answer's end, and the median time from submitting to an
    answer's first draft. Every answer continues the same prompt, already in every slot (as a conversation's is when
    encoded ahead): this times decoding, not prompt encoding, and on a CPU 64 prefills would not fit the minute.
    Identical greedy answers cost what different ones do."""
    model = runner.model
    block = model.config.block_length
    length = -(-budget.new_tokens // block) * block
    first_draft: list[float] = []
    tokens: list[int] = []

    def read(run: Run) -> None:
        for index, refinement in enumerate(run):
            if index == 0:
                first_draft.append(time.perf_counter() - started)  # list.append: atomic under the GIL
            if refinement.done:
                tokens.append(refinement.answer_length)

    with PassLog() as log:
        started = time.perf_counter()
        runs = [runner.submit(sequence(mode, model, subject.eos, subject.prompt, length), interactive=True)
                for _ in range(runner.max_batch)]
        readers = [threading.Thread(target=read, args=(run,)) for run in runs]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        seconds = time.perf_counter() - started

    passes = sum(run.passes for run in runs)
    return {
        "answers": runner.max_batch, "tokens": sum(tokens), "seconds": round(seconds, 4),
        "tokens_per_s": round(sum(tokens) / seconds, 2),
        "tokens_per_pass": round(sum(tokens) / passes, 3) if passes else 0.0,  # per answer
        "batched_passes": len(log.sizes),
        "first_draft_ms_median": round(statistics.median(first_draft) * 1e3, 2),
    }


def decoding_runs(subject: Subject, budget: Budget) -> dict[str, dict[str, Any]]:
    """`decode` in every mode for 1 and 64 answers: one runner per batch size, its slots holding the prompt."""
    model = subject.model
    results: dict[str, dict[str, Any]] = {mode: {} for mode in MODES}
    for answers in DECODING_BATCHES:
        runner = BatchRunner(model, max_batch=answers)
        try:
            with torch.inference_mode():
                prefill(model, runner.cache, 0, subject.prompt[:-1])
                for slot in range(1, answers):
                    copy_slot(runner.cache, 0, slot)
            for mode in MODES:
                results[mode][f"batch={answers}"] = decode(runner, subject, mode, budget)
        finally:
            runner.close()
    return results


def memory(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        gib = 2**30
        return {"gpu_peak_allocated_gib": round(torch.cuda.max_memory_allocated(device) / gib, 3),
                "gpu_peak_reserved_gib": round(torch.cuda.max_memory_reserved(device) / gib, 3),
                "gpu_total_gib": round(torch.cuda.get_device_properties(device).total_memory / gib, 1)}
    return {"host_peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    parser.add_argument("--random", action="store_true", help="random weights even when the bundled ones are here")
    parser.add_argument("--json", type=Path, default=Path("device_check.json"))
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default: half the cores, as a voice process gives its LM)")
    args = parser.parse_args(argv)
    # Half the cores by default, as voice.engines.default_lm_threads gives a voice process's LM: on the 2-core
    # development machine shared with other work (load average ~6), two threads took 144 s for this check and one
    # 28 s; a team of two OpenMP threads stalls at every barrier while either waits for a core.
    set_torch_threads(args.threads or max(1, (os.cpu_count() or 1) // 2))
    begun = time.perf_counter()
    try:
        device = resolve_device(args.device)
    except ModelError as error:
        print(f"device_check: {error}", file=sys.stderr)
        return 2
    budget = Budget.for_device(device)
    subject = build(device, args.random, budget.cache_length)
    model = subject.model
    built = time.perf_counter() - begun
    print(f"{subject.weights} weights on {describe(device)}, built in {built:.1f} s", flush=True)
    costs = pass_costs(model, device, budget)
    print(f"pass cost (ms): {json.dumps(costs)}", flush=True)
    decoding = decoding_runs(subject, budget)
    for mode, runs in decoding.items():
        print(f"{mode}: " + ", ".join(f"{key} {value['tokens_per_s']} tokens/s" for key, value in runs.items()))
    report = {
        "device": describe(device),
        "device_type": device.type,
        "dtype": str(model.base.dtype).removeprefix("torch."),
        "adapter_dtype": str(next(model.trainable_parameters()).dtype).removeprefix("torch."),
        "weights": subject.weights,
        "decoding_prompt_tokens": len(subject.prompt),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "launch_overhead": "eager: one kernel launch per op (no CUDA graphs)",
        "budget": {"cache_length": budget.cache_length, "warmup": budget.warmup, "repeats": budget.repeats,
                   "new_tokens": budget.new_tokens},
        "build_s": round(built, 2),
        "pass_cost_ms": costs,
        "decoding": decoding,
        "memory": memory(device),
        "seconds_total": round(time.perf_counter() - begun, 1),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json} in {report['seconds_total']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
