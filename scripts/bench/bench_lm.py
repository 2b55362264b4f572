"""Benchmark a diffusion LM: tokens/s and tokens per pass for three commit policies, with and without the cache.

    python scripts/bench/bench_lm.py                       # the bundled default model
    python scripts/bench/bench_lm.py --model tiny          # a random SmolLM2-135M-shaped block-diffusion model
    python scripts/bench/bench_lm.py --model tiny-masked   # a random ModernBERT of similar size (approximate cache)
    python scripts/bench/bench_lm.py --model PATH --json artifacts/bench_lm.json
    python scripts/bench/bench_lm.py --pass-costs 1,4,8,12,16,24 --cache-length 200   # self-speculative pass costs
    python scripts/bench/bench_lm.py --batch-costs 1,2,4,8 --cache-length 200         # one batched pass over B answers
    python scripts/bench/bench_lm.py --row-costs 1,2,4,8 --model FILE.gguf   # where a pass's rows' time goes
    python scripts/bench/bench_lm.py --batch-agreement 8    # answers decoded together vs alone (bundled model, bf16)
    python scripts/bench/bench_lm.py --prefill-costs 8,32,128 --threads 2   # a prompt's prefill: decode kernel vs bf16

Policies: (a) one token per pass, (b) a fixed k tokens per pass, (c) confidence-threshold decoding (at least one per
pass). Each runs over the prompt set with the cache on and off, through the chat model's own loop
(`report_lib.passes.answer_refinements`: the back end's, the batch runner for a block-diffusion model). Separately it
times single passes for a 256-token prompt and a 32-token block, cached vs uncached (the cost the cache is meant to
cut). Figures are printed, never asserted: they depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from model.adapters.sampler_backend import SamplerBackend
from model.bundled.backend import BlockDiffusionBackend
from model.chat.engine import DiffusionChatModel
from model.chat.spec import ModelSpec
from model.decoding.denoiser import Denoiser
from model.decoding.sampler import SamplerConfig
from model.device import DEVICE_CHOICES, describe, resolve_device
from model.errors import ModelError
from model.process.threads import set_torch_threads
from model.runtime.batching import KEY_MULTIPLE, Feed, PassRows, SlotCache, batched_pass, prefill
from scripts.report_lib.passes import PassLog, answer_refinements, stop_batching
from scripts.report_lib.tiny_models import smollm2_shaped_llama

PROMPTS = (
    "What's the weather like on Mars?",
    "Tell me a fun fact about octopuses.",
    "How do I boil an egg?",
    "Can you recommend a good book for a long train ride?",
)


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    cache: bool
    tokens: int  # committed answer tokens (before EOS)
    passes: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0


def tiny_block_diffusion(block_length: int, device: torch.device) -> tuple[BlockDiffusionBackend, int]:
    """Random LlamaForCausalLM of SmolLM2-135M's shape, wrapped by the block-diffusion adapter."""
    from model.bundled.block_diffusion import AdapterConfig, BlockDiffusionLM

    base = smollm2_shaped_llama(device)
    model = BlockDiffusionLM(base, AdapterConfig(block_length=block_length)).eval().to(device)
    return BlockDiffusionBackend(model, eos_ids=[2]), int(base.config.vocab_size)


def tiny_masked_lm(device: torch.device) -> tuple[Denoiser, int]:
    """Random ModernBERT of roughly 135M parameters behind the masked-LM adapter."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from model.adapters.masked_lm import MaskedLMDenoiser

    config = ModernBertConfig(
        vocab_size=50368,
        hidden_size=768,
        intermediate_size=1152,
        num_hidden_layers=16,
        num_attention_heads=12,
        max_position_embeddings=8192,
        pad_token_id=0,
        mask_token_id=4,
        eos_token_id=1,
        bos_token_id=2,
        cls_token_id=2,
        sep_token_id=1,
    )
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(config).eval().to(device)
    return MaskedLMDenoiser(model, 4, frozenset({1})), config.vocab_size


def build(
    spec: str | None, block_length: int | None, device: torch.device
) -> tuple[DiffusionChatModel, list[list[int]], int, str]:
    """Chat model, tokenized prompts, block length and a description for a model spec."""
    if spec in ("tiny", "tiny-masked"):
        length = block_length or 8
        denoiser, vocab = tiny_block_diffusion(length, device) if spec == "tiny" else tiny_masked_lm(device)
        generator = torch.Generator().manual_seed(1)
        # random weights: any ids do; prompt lengths like a short chat turn with its template
        prompts = [torch.randint(10, vocab, (40 + 8 * i,), generator=generator).tolist() for i in range(len(PROMPTS))]
        params = sum(p.numel() for p in denoiser.model.parameters())
        config = SamplerConfig(length, length)
        backend = denoiser if isinstance(denoiser, BlockDiffusionBackend) else SamplerBackend(spec, denoiser, config)
        chat = DiffusionChatModel(spec, None, backend, config)  # no tokenizer: ids only
        return chat, prompts, length, f"{spec} (random weights, {params / 1e6:.0f}M parameters)"
    from model.chat import ChatMessage
    from model.loading import load_chat_model
    from voice.think.spoken import SPOKEN_SYSTEM_PROMPT

    chat = load_chat_model(ModelSpec(spec, device=str(device)))
    if not isinstance(chat, DiffusionChatModel) or network(chat) is None:
        raise ModelError(f"{spec!r} is not a masked-diffusion model; this benchmark drives the masked sampler")
    prompts = [chat.prompt_ids([ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", text)])
               for text in PROMPTS]
    return chat, prompts, block_length or chat.sampler.block_length, chat.name


def run_mode(chat: DiffusionChatModel, prompts: list[list[int]], max_new_tokens: int, config: SamplerConfig,
             name: str) -> ModeResult:
    tokens = passes = 0
    started = time.perf_counter()
    for prompt in prompts:
        refinements = list(answer_refinements(chat, prompt, max_new_tokens, config))
        passes += len(refinements)
        tokens += sum(refinements[-1].committed[: refinements[-1].answer_length])
    return ModeResult(name, config.use_cache, tokens, passes, time.perf_counter() - started)


def network(chat: DiffusionChatModel) -> Denoiser | BlockDiffusionBackend | None:
    """What `pass_cost` times one pass of: the bundled back end's network, or an external checkpoint's denoiser
    (None for a back end with its own loop, DiffusionGemma)."""
    backend = chat.backend
    if isinstance(backend, BlockDiffusionBackend):
        return backend
    return backend.denoiser if isinstance(backend, SamplerBackend) else None


def pass_cost(
    denoiser: Denoiser | BlockDiffusionBackend, use_cache: bool, prompt_tokens: int, block: int, repeats: int
) -> float:
    """Median seconds of one pass over a fully masked `block` after a `prompt_tokens` prompt (prompt encoding and
    the first pass of a block, which refreshes an approximate cache, are excluded). A block-diffusion model's pass is
    the runner's (`batched_pass` on a one-slot cache): cached, the block after the encoded prompt (a block's second
    pass); uncached, the prompt and the block in one pass."""
    prompt = torch.randint(10, 1000, (prompt_tokens,), generator=torch.Generator().manual_seed(2)).tolist()
    masks = (denoiser.mask_id,) * block
    if isinstance(denoiser, BlockDiffusionBackend):
        model, cache = denoiser.model, SlotCache(1)
        if use_cache:
            prefill(model, cache, 0, prompt)
        feed = Feed(clean=() if use_cache else tuple(prompt), noisy=masks)

        def one_pass() -> None:
            batched_pass(model, cache, [0], [feed])  # its logits come back to the host: the pass is done
    else:
        canvas = torch.tensor(masks, dtype=torch.long)
        denoiser.start(prompt, block, use_cache)

        def one_pass() -> None:
            denoiser.block_logits(canvas, 0, block).cpu()  # .cpu() waits for an accelerator to finish
    one_pass()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def verify_pass_costs(model: Any, cache_length: int, sizes: list[int], repeats: int) -> dict[str, list[float]]:
    """Median seconds of one pass after `cache_length` cached tokens, for each size n: the autoregressive form (n
    clean tokens, gate off), the drafting form (1 clean token + n - 1 drafting masks, gate on for the masks) and n
    answers' autoregressive steps in one pass (1 clean token each, every answer its own slot), each through the fused
    pass (model/runtime/fast_pass.py, what decoding runs: on the int4 weights when the model has them, and on the
    bf16 ones) and through transformers' modules (bf16, the same logits as the bf16 fused pass). Each is the runner's
    pass (`batched_pass`); nothing is kept, so the cache lengths stay fixed."""
    from model.runtime.fast_pass import FastPass

    fused = model.inference_pass()
    variants = {"fused pass": lambda: fused, "modules": lambda: model}
    if getattr(model, "int4", None) is not None:
        int4, model.int4 = model.int4, None
        bf16 = FastPass(model)
        model.int4 = int4
        variants = {"fused pass, int4": lambda: fused, "fused pass, bf16": lambda: bf16, "modules": lambda: model}
    prompt = torch.randint(10, 1000, (cache_length + 1,), generator=torch.Generator().manual_seed(2)).tolist()
    cache = SlotCache(max(sizes))
    for slot in range(max(sizes)):
        prefill(model, cache, slot, prompt[:-1])
    last = tuple(prompt[-1:])
    forms = {
        "clean": lambda n: ([0], [Feed(last * n)]),
        "1 + masks": lambda n: ([0], [Feed(last, (model.mask_id,) * (n - 1), drafts=True)]),
        "answers": lambda n: (list(range(n)), [Feed(last)] * n),
    }
    times: dict[tuple[str, str, int], list[float]] = {(v, f, n): [] for v in variants for f in forms for n in sizes}
    try:
        for round_ in range(repeats + 1):  # round-robin over everything, so a busy moment of the machine hits all
            for variant, form, n in times:
                model.inference_pass = variants[variant]
                slots, feeds = forms[form](n)
                started = time.perf_counter()
                batched_pass(model, cache, slots, feeds)
                if round_:  # the first round builds each shape's kernels: not timed
                    times[(variant, form, n)].append(time.perf_counter() - started)
    finally:
        del model.inference_pass  # the class's own method again
    return {
        f"{form}, {variant}": [statistics.median(times[(variant, form, n)]) for n in sizes]
        for variant in variants
        for form in forms
    }


def model_to_time(args: argparse.Namespace) -> Any:
    """The chat model of `args`, its batch runner stopped: the passes are timed on this thread, so that one OpenMP
    team runs them (the runner's thread keeps the team it calibrated with)."""
    from model.loading import load_chat_model

    chat = load_chat_model(ModelSpec(args.model, device=str(args.device), weights=args.weights))
    stop_batching(chat)
    return chat


def pass_cost_main(args: argparse.Namespace) -> int:
    """--pass-costs: the table the self-speculative layout is chosen from (bundled model, bf16)."""
    chat = model_to_time(args)
    sizes = [int(n) for n in args.pass_costs.split(",")]
    with torch.inference_mode():
        costs = verify_pass_costs(chat.backend.model, args.cache_length, sizes, args.pass_repeats)
    print(f"one cached pass after {args.cache_length} tokens, {torch.get_num_threads()} threads, median of "
          f"{args.pass_repeats} (ms)")
    print("n (tokens or answers) | " + " | ".join(costs) + " (in brackets: against one row, each variant's own)")
    # one row: the median of a variant's three forms at n = 1 (the same pass: a lone clean row)
    lone = {name: statistics.median(c[0] for k, c in costs.items() if k.endswith(name.split(", ", 1)[1]))
            for name in costs} if sizes[0] == 1 else {name: column[0] for name, column in costs.items()}
    for i, n in enumerate(sizes):
        cells = [f"{column[i] * 1e3:.1f} ({column[i] / lone[name]:.2f}x)" for name, column in costs.items()]
        print(f"{n:>6} | " + " | ".join(cells))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"cache_length": args.cache_length, "sizes": sizes, "threads": torch.get_num_threads(), **costs}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def prefill_costs(model: Any, sizes: list[int], repeats: int) -> dict[str, list[float]]:
    """Median seconds of a prefill of n prompt tokens on an empty cache (model/runtime/batching.py `prefill`), the
    way this CPU runs it (int4 through the decode kernel) and forced to bf16
    (`FastPass.int4_prefill`), interleaved."""
    from model.runtime.fast_pass import FastPass

    tokens = torch.randint(10, 1000, (max(sizes),), generator=torch.Generator().manual_seed(3)).tolist()
    chosen = FastPass.int4_prefill
    ways = {"int4 kernel": chosen, "bf16": lambda self, rows: False}
    times: dict[tuple[str, int], list[float]] = {(way, n): [] for way in ways for n in sizes}
    try:
        for round_ in range(repeats + 1):
            for way, n in times:
                FastPass.int4_prefill = ways[way]  # type: ignore[method-assign]
                started = time.perf_counter()
                prefill(model, SlotCache(1), 0, tokens[:n])
                if round_:
                    times[(way, n)].append(time.perf_counter() - started)
    finally:
        FastPass.int4_prefill = chosen  # type: ignore[method-assign]
    return {way: [statistics.median(times[(way, n)]) for n in sizes] for way in ways}


def prefill_cost_main(args: argparse.Namespace) -> int:
    """--prefill-costs: what encoding a prompt costs, through the decode kernel against bf16 matmuls."""
    chat = model_to_time(args)
    sizes = [int(n) for n in args.prefill_costs.split(",")]
    with torch.inference_mode():
        costs = prefill_costs(chat.backend.model, sizes, args.pass_repeats)
    print(f"one prefill on an empty cache, {torch.get_num_threads()} threads, median of {args.pass_repeats} (ms)")
    print("tokens | " + " | ".join(costs))
    for i, n in enumerate(sizes):
        print(f"{n:>6} | " + " | ".join(f"{column[i] * 1e3:.1f}" for column in costs.values()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"sizes": sizes, "threads": torch.get_num_threads(), **costs}, indent=2))
    return 0


def answers_cache(model: Any, answers: int, cache_length: int) -> SlotCache:
    """A cache of `answers` slots, each holding its own random prompt of about `cache_length` tokens (lengths differ
    by a few tokens, as real answers' do)."""
    cache = SlotCache(answers)
    generator = torch.Generator().manual_seed(2)
    for slot in range(answers):
        prefill(model, cache, slot, torch.randint(10, 1000, (cache_length + 3 * slot,), generator=generator).tolist())
    return cache


def batch_pass_costs(model: Any, cache_length: int, batches: list[int], repeats: int) -> dict[str, list[float]]:
    """Median seconds of one batched pass (model/runtime/batching.py) over B answers, each after its own cache of about
    `cache_length` tokens (lengths differ by a few tokens, as real answers do), for the row shapes of each mode:
    autoregressive (1 clean row), self-speculative (1 clean + 4 masks, drafts rejected; 5 clean + 4 masks, drafts
    accepted) and diffusion (a finished block of 4 clean + 4 noisy). Nothing is kept, so lengths stay fixed."""
    mask = model.mask_id
    forms = {
        "autoregressive 1": Feed((11,)),
        "self-spec 1+4": Feed((11,), (mask,) * 4, drafts=True),
        "self-spec 5+4": Feed((11, 12, 13, 14, 15), (mask,) * 4, drafts=True),
        "diffusion 4+4": Feed((11, 12, 13, 14), (15, mask, mask, mask)),
    }
    cache = answers_cache(model, max(batches), cache_length)
    times: dict[tuple[str, int], list[float]] = {(form, b): [] for form in forms for b in batches}
    for round_ in range(repeats + 1):  # round-robin, so a busy moment of the machine hits every shape alike
        for form, b in times:
            started = time.perf_counter()
            batched_pass(model, cache, list(range(b)), [forms[form]] * b)
            if round_:  # the first round builds each shape's kernels: not timed
                times[(form, b)].append(time.perf_counter() - started)
    return {form: [statistics.median(times[(form, b)]) for b in batches] for form in forms}


def batch_cost_main(args: argparse.Namespace) -> int:
    """--batch-costs: what a pass over B answers costs against one (bundled model, bf16)."""
    chat = model_to_time(args)
    batches = [int(n) for n in args.batch_costs.split(",")]
    costs = batch_pass_costs(chat.backend.model, args.cache_length, batches, args.pass_repeats)
    print(f"one batched pass, ~{args.cache_length} cached tokens per answer, {torch.get_num_threads()} threads, "
          f"median of {args.pass_repeats} (ms; in brackets: cost relative to B = {batches[0]})")
    print("answers | " + " | ".join(costs))
    for i, b in enumerate(batches):
        cells = [f"{column[i] * 1e3:.1f} ({column[i] / column[0]:.2f}x)" for column in costs.values()]
        print(f"{b:>7} | " + " | ".join(cells))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"cache_length": args.cache_length, "batches": batches, "threads": torch.get_num_threads(), **costs}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


ROW_PARTS = ("pass", "layers", "linears", "attention and the rest", "head", "around the kernels", "probabilities")


def row_costs(model: Any, cache_length: int, sizes: list[int], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Median seconds of each part of one decoding pass of n rows through the decode kernel, for the rows of one
    answer (1 clean row + n - 1 drafting masks, self-speculative's shape) and for n answers of 1 clean row each: the
    whole pass as the runner calls it (`batched_pass`), its layers (`FastPass.hidden_rows`: one C call), their
    linears alone (every layer's four, each `weight_rows` call on the same rows), the head (`FastPass.logits`), what
    runs around the kernels (the pass less its layers and head: the rows' layout, the embedding, Python), and the
    softmax the decoding step takes of each row. Round-robin over every shape, so a busy moment hits all alike."""
    fast = model.inference_pass()
    if not fast.takes_rows():
        raise ModelError("--row-costs times the decode kernel's passes, which this model does not take")
    cache = answers_cache(model, max(sizes), cache_length)
    generator = torch.Generator().manual_seed(3)  # the linears' random rows
    mask = model.mask_id
    forms = {
        "one answer": lambda n: ([0], [Feed((11,), (mask,) * (n - 1), drafts=True)]),
        "answers": lambda n: (list(range(n)), [Feed((11,))] * n),
    }
    linears = [linear for layer in fast.layers for linear in (layer.int4.qkv, layer.int4.o, layer.int4.gate_up,
                                                                layer.int4.down)]

    def parts(slots: list[int], feeds: list[Feed]) -> dict[str, float]:
        lengths = [len(cache.slots[slot].ids) for slot in slots]
        cache.bind(slots, lengths)
        rows = PassRows.of(slots, lengths, feeds, KEY_MULTIPLE)
        timed: dict[str, float] = {}
        started = time.perf_counter()
        batched_pass(model, cache, slots, feeds)
        timed["pass"] = time.perf_counter() - started
        started = time.perf_counter()
        h = fast.hidden_rows(rows, cache)
        timed["layers"] = time.perf_counter() - started
        x = torch.randn(h.shape[0], max(linear.in_features for linear in linears), generator=generator)
        started = time.perf_counter()
        for linear in linears:
            linear(x[:, : linear.in_features], rows.coarse)
        timed["linears"] = time.perf_counter() - started
        started = time.perf_counter()
        logits = fast.logits(h, rows.coarse)
        timed["head"] = time.perf_counter() - started
        started = time.perf_counter()
        torch.softmax(logits, dim=-1)
        timed["probabilities"] = time.perf_counter() - started
        timed["attention and the rest"] = timed["layers"] - timed["linears"]
        timed["around the kernels"] = timed["pass"] - timed["layers"] - timed["head"]
        return timed

    times = {(form, n, part): [] for form in forms for n in sizes for part in ROW_PARTS}
    for round_ in range(repeats + 1):
        for form in forms:
            for n in sizes:
                timed = parts(*forms[form](n))
                if round_:  # the first round builds each shape's buffers: not timed
                    for part, seconds in timed.items():
                        times[(form, n, part)].append(seconds)
    return {form: {part: [statistics.median(times[(form, n, part)]) for n in sizes] for part in ROW_PARTS}
            for form in forms}


def row_cost_main(args: argparse.Namespace) -> int:
    """--row-costs: where the time of a pass's rows goes, by part, for n rows of one answer and for n answers."""
    chat = model_to_time(args)
    sizes = [int(n) for n in args.row_costs.split(",")]
    with torch.inference_mode():
        costs = row_costs(chat.backend.model, args.cache_length, sizes, args.pass_repeats)
    print(f"one pass through the decode kernel, ~{args.cache_length} cached tokens per answer, "
          f"{torch.get_num_threads()} threads, median of {args.pass_repeats} (ms; in brackets: the pass against n = "
          f"{sizes[0]}; each extra row's cost after the table)")
    for form, table in costs.items():
        print(f"{form}: n | " + " | ".join(ROW_PARTS))
        for i, n in enumerate(sizes):
            cells = [f"{table[part][i] * 1e3:.2f}" for part in ROW_PARTS]
            cells[0] += f" ({table['pass'][i] / table['pass'][0]:.2f}x)"
            print(f"{n:>4} | " + " | ".join(cells))
        if len(sizes) > 1:
            extra = sizes[-1] - sizes[0]
            print(f"  each extra row, n = {sizes[0]} -> {sizes[-1]} (ms): " + ", ".join(
                f"{part} {(table[part][-1] - table[part][0]) * 1e3 / extra:.2f}" for part in ROW_PARTS))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"cache_length": args.cache_length, "sizes": sizes, "threads": torch.get_num_threads(), **costs}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


AGREEMENT_PROMPTS = (
    *PROMPTS,
    "What is a good name for a cat?",
    "How far away is the moon?",
    "Give me a tip for sleeping better.",
    "Why is the sky blue?",
)


def batch_agreement_main(args: argparse.Namespace) -> int:
    """--batch-agreement N: N answers decoded one after another (each alone in its pass) and then all at once (in
    shared passes); how many are identical. In fp32 they must all be (tests/unit/test_batching.py); in bf16 a batch
    uses other kernels than a single answer, so near-ties can flip."""
    import threading

    from model.chat import ChatMessage, GenerationOptions
    from model.loading import load_chat_model
    from voice.think.spoken import SPOKEN_RULES, SPOKEN_SYSTEM_PROMPT

    chat = load_chat_model(ModelSpec(args.model, device=str(args.device), precision="fp32" if args.fp32 else "bf16"))
    questions = [AGREEMENT_PROMPTS[i % len(AGREEMENT_PROMPTS)] for i in range(args.batch_agreement)]
    options = GenerationOptions(max_new_tokens=args.max_new_tokens, rules=SPOKEN_RULES)

    def answer(question: str) -> str:
        messages = [ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", question)]
        return list(chat.stream_chat(messages, options))[-1].text

    alone = [answer(question) for question in questions]
    together: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, answer(questions[i])))
               for i in range(len(questions))]
    with PassLog() as log:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    widest = max(log.sizes, default=1)
    same = sum(alone[i] == together[i] for i in range(len(questions)))
    print(f"{same}/{len(questions)} answers identical alone and in shared passes (up to {widest} answers a pass)")
    for i in range(len(questions)):
        if alone[i] != together[i]:
            print(f"  alone:    {alone[i]!r}\n  together: {together[i]!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="spec, 'tiny' or 'tiny-masked' (default: the bundled model)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--block-length", type=int, default=None)
    parser.add_argument("--k", type=int, default=2, help="tokens per pass for the fixed policy")
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts to use")
    parser.add_argument("--pass-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                        help="where the model runs (auto: a CUDA GPU when torch sees one, else the CPU)")
    parser.add_argument("--weights", choices=("auto", "int4", "bf16"), default="auto", help="the bundled model's")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--pass-costs", default=None, help="e.g. 1,4,8,12,16,24: time self-speculative passes only")
    parser.add_argument("--cache-length", type=int, default=200, help="cached tokens before the timed passes")
    parser.add_argument("--prefill-costs", default=None, help="e.g. 8,32,128: time prefills of that many tokens")
    parser.add_argument("--batch-costs", default=None, help="e.g. 1,2,4,8: time batched passes over that many answers")
    parser.add_argument("--row-costs", default=None, help="e.g. 1,2,4,8: where a pass's rows' time goes, by part")
    parser.add_argument("--batch-agreement", type=int, default=0, help="N: answers together vs alone")
    parser.add_argument("--fp32", action="store_true", help="--batch-agreement in fp32 (bundled model)")
    args = parser.parse_args(argv)
    try:
        args.device = resolve_device(args.device)
    except ModelError as error:
        print(f"bench_lm: {error}", file=sys.stderr)
        return 2
    if args.threads:
        set_torch_threads(args.threads)
    if args.pass_costs:
        return pass_cost_main(args)
    if args.row_costs:
        return row_cost_main(args)
    if args.batch_costs:
        return batch_cost_main(args)
    if args.prefill_costs:
        return prefill_cost_main(args)
    if args.batch_agreement:
        return batch_agreement_main(args)

    try:
        chat, prompts, block, name = build(args.model, args.block_length, args.device)
        prompts = prompts[: args.prompts]
        max_new = -(-args.max_new_tokens // block) * block
        if block % args.k:
            raise ModelError(f"--k {args.k} must divide the block length {block}")
        policies = {
            "one/pass": SamplerConfig(block, block),
            f"{args.k}/pass": SamplerConfig(block, block // args.k),
            f"threshold {args.threshold}": SamplerConfig(block, block, threshold=args.threshold),
        }
        # outside inference mode: an answer's decoding state is made here and edited on the runner's thread
        results = [
            run_mode(chat, prompts, max_new, SamplerConfig(**{**asdict(cfg), "use_cache": cache}), mode)
            for mode, cfg in policies.items()
            for cache in (True, False)
        ]
        stop_batching(chat)  # the single passes are timed on this thread (see `model_to_time`)
        with torch.inference_mode():
            subject = network(chat)
            if subject is None:
                raise ModelError(f"{name} runs its own loop: no single pass to time")
            cached = pass_cost(subject, True, 256, 32, args.pass_repeats)
            uncached = pass_cost(subject, False, 256, 32, args.pass_repeats)
    except ModelError as error:
        print(f"bench_lm: {error}", file=sys.stderr)
        return 2

    print(f"model: {name}; block {block}, {max_new} new tokens, {len(prompts)} prompts, "
          f"{torch.get_num_threads()} torch threads, {describe(args.device)}")
    print(f"{'policy':<16}{'cache':<7}{'tokens':>7}{'passes':>8}{'seconds':>9}{'tok/s':>8}{'tok/pass':>10}")
    for r in results:
        print(f"{r.mode:<16}{'on' if r.cache else 'off':<7}{r.tokens:>7}{r.passes:>8}{r.seconds:>9.2f}"
              f"{r.tokens_per_s:>8.1f}{r.tokens_per_pass:>10.2f}")
    print(f"one pass, 256-token prompt, 32-token block: cached {cached * 1e3:.1f} ms, uncached {uncached * 1e3:.1f} ms "
          f"(cached/uncached = {cached / uncached:.2f})")
    if args.json:
        report: dict[str, Any] = {
            "model": name,
            "block_length": block,
            "max_new_tokens": max_new,
            "prompts": len(prompts),
            "threads": torch.get_num_threads(),
            "device": describe(args.device),
            "modes": [asdict(r) | {"tokens_per_s": r.tokens_per_s, "tokens_per_pass": r.tokens_per_pass}
                      for r in results],
            "pass_cost": {"prompt_tokens": 256, "block": 32, "cached_s": cached, "uncached_s": uncached,
                          "ratio": cached / uncached},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
