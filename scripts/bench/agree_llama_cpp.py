"""This runtime's logits against llama.cpp's on the same GGUF file and the same tokens: is it faithful to the file?

    python scripts/bench/agree_llama_cpp.py --model FILE [FILE ...] [--text FILE] [--tokens 512] [--threads 2]
        [--json PATH]

Both engines read the same held-out text, teacher-forced (each position sees the true tokens before it): this runtime
through the path `--model FILE` serves by (the chat model `load_chat_model` builds, its file's own blocks in the C
kernels on a CPU, one token a decoding pass over its slot cache, as an answer decodes), llama.cpp through
`llama_cpp.Llama(logits_all=True)` (llama-cpp-python, `make install-bench`). The token ids are ours (the file's
tokenizer as transformers reads it, the BOS the file asks for) and llama.cpp is handed the same ids. The default
text is tests/data/heldout_prompts.txt, questions that no tuning of this project read.

Reported per file (architecture and the types of its tensors): top-1 agreement (the same argmax), mean and 99th
percentile of KL(llama.cpp || ours) in nats, each engine's perplexity of the text and ours over llama.cpp's.

What the arithmetic allows. The engines multiply by the same blocks but round differently: llama.cpp rounds each
group of 32 activations to 8 bits before a matmul (q8_0 / q8_1 / q8_K: off by up to 1/254 of the group's largest)
and keeps an f16 KV cache; this runtime rounds them to ~16 bits (quant_matmul.c's remainder: 1/64516) and keeps the
residual stream in fp32, its KV cache and embedding in bf16 (a relative 2^-9). Neither is the exact network, so
both are also compared with it: the file's tensors de-quantized by gguf-py, the network in fp32 throughout
(transformers, one forward). Summed over a model's layers, a relative rounding of ~1e-3 a product moves the logits
by a few hundredths; a logit noise of standard deviation s gives KL ~ s^2 / 2 (~1e-3 at s ~ 0.05) and flips the
argmax only at near-ties, a few percent of positions in a 49k vocabulary. Perplexity moves by the mean of the
log-probability differences, which cancel. So the criteria (`within_tolerance`): this runtime is at least as
close to the exact network as llama.cpp is (mean KL; top-1 is reported), and the two perplexities agree within 1 %;
the disagreement between the engines is then llama.cpp's own rounding, and its size is reported, not bounded. The
1 % holds for a trained model on text; a tiny random network (scripts/report_lib/tiny_gguf.py: perplexities of ~10^4 on
a 262-token vocabulary, its logits far larger than a trained model's) moves its perplexity by percents under either
engine's rounding, so there only the closeness to the exact network is held to. A wrong layer (a
missing bias or norm, rows in the wrong order, a mis-read scale) puts this runtime far from the exact network: KL
of order 1, top-1 near chance.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model.process.threads import set_torch_threads

ROOT = Path(__file__).resolve().parents[2]

HELDOUT = ROOT / "tests" / "data" / "heldout_prompts.txt"
MAX_PPL_RATIO_OFF = 0.01  # the perplexity ratio's tolerance, from the module docstring


@dataclass(frozen=True, slots=True)
class Agreement:
    """How close two engines' next-token distributions are over the same positions."""

    positions: int
    top1: float  # the same argmax
    kl_mean: float  # KL(reference || ours), nats
    kl_p99: float
    ppl_reference: float
    ppl_ours: float

    @property
    def ppl_ratio(self) -> float:
        return self.ppl_ours / self.ppl_reference


def closer_to_exact(ours_to_exact: Agreement, llama_cpp_to_exact: Agreement) -> bool:
    """This runtime at least as close to the exact network as llama.cpp is, in mean KL. Not in top-1: a flip is a
    near-tie that either rounding may tip, a coin toss at each; over a few hundred positions one engine's luck."""
    return ours_to_exact.kl_mean <= llama_cpp_to_exact.kl_mean


def within_tolerance(ours_to_exact: Agreement, llama_cpp_to_exact: Agreement, between: Agreement) -> bool:
    """The module docstring's criteria: `closer_to_exact`, and the engines' perplexities within 1 %."""
    return closer_to_exact(ours_to_exact, llama_cpp_to_exact) and abs(between.ppl_ratio - 1) <= MAX_PPL_RATIO_OFF


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise, in float64 (a KL of 1e-4 is below float32's resolution of a log-probability)."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def agreement(reference: np.ndarray, ours: np.ndarray, targets: np.ndarray) -> Agreement:
    """`reference` and `ours` `[N, V]` logits predicting `targets` `[N]` (the next token of each position)."""
    if reference.shape != ours.shape or reference.shape[0] != len(targets):
        raise ValueError(f"logits {reference.shape} and {ours.shape} for {len(targets)} targets")
    p, q = log_softmax(reference), log_softmax(ours)
    kl = (np.exp(p) * (p - q)).sum(axis=-1)
    rows = np.arange(len(targets))
    return Agreement(
        positions=len(targets),
        top1=float(np.mean(reference.argmax(-1) == ours.argmax(-1))),
        kl_mean=float(kl.mean()),
        kl_p99=float(np.percentile(kl, 99)),
        ppl_reference=float(np.exp(-p[rows, targets].mean())),
        ppl_ours=float(np.exp(-q[rows, targets].mean())),
    )


def text_ids(path: Path, text: str, tokens: int) -> list[int]:
    """The first `tokens` ids of `text` in the file's tokenizer, after the BOS when the file asks for one."""
    from model.chat.spec import ModelSpec

    header = ModelSpec(source=str(path)).gguf
    assert header is not None  # a .gguf path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = tokenizer.encode(text, add_special_tokens=False)
    bos = header.token_id("bos")
    if header.metadata.get("tokenizer.ggml.add_bos_token") and bos is not None:
        ids = [bos, *ids]
    limit = min(tokens, header.context_length or tokens)
    if len(ids) < limit:
        raise ValueError(f"{len(ids)} tokens of text, {limit} asked")
    return ids[:limit]


def runtime_logits(path: Path, ids: list[int]) -> tuple[np.ndarray, str]:
    """This runtime's fp32 logits `[len(ids) - 1, V]` predicting `ids[1:]`, and the load's note (which weights):
    the model `--model path` loads, a prefill of the first token, then one token a decoding pass."""
    import torch

    from model.chat.engine import DiffusionChatModel
    from model.chat.spec import ModelSpec
    from model.loading import load_chat_model
    from model.runtime.batching import Feed, SlotCache, batched_pass, keep, prefill

    chat = load_chat_model(ModelSpec(source=str(path)))
    if not isinstance(chat, DiffusionChatModel):
        raise TypeError(f"{path}: not a model of this runtime's back end")
    model = chat.backend.model  # type: ignore[attr-defined]
    cache = SlotCache(1)
    with torch.inference_mode():
        _, first = prefill(model, cache, 0, ids[:1])
        assert first is not None
        rows = [first.float().numpy()]
        for token in ids[1:-1]:
            feed = Feed(clean=(token,))
            [(clean, _)] = batched_pass(model, cache, [0], [feed])
            keep(cache, 0, feed, 1)
            rows.append(clean[0].float().numpy())
    return np.stack(rows), chat.note or ""


def exact_logits(path: Path, ids: list[int]) -> np.ndarray:
    """The exact network's logits `[len(ids) - 1, V]` predicting `ids[1:]`: every tensor of the file de-quantized by
    gguf-py, fp32 throughout, one forward through transformers' modules (no cache, no kernels of ours)."""
    import torch

    from model.chat.spec import ModelSpec
    from model.loading import load_chat_model

    chat = load_chat_model(ModelSpec(source=str(path), precision="fp32"))
    base = chat.backend.model.base  # type: ignore[attr-defined]
    with torch.inference_mode():
        return base(torch.tensor([ids])).logits[0, :-1].float().numpy()


def llama_cpp_logits(path: Path, ids: list[int], threads: int) -> np.ndarray:
    """llama.cpp's logits `[len(ids) - 1, V]` predicting `ids[1:]`, the ids evaluated as one prompt."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=len(ids) + 8, n_batch=512, logits_all=True, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids) - 1], dtype=np.float32)
    llm.close()
    return logits


def linear_types(path: Path) -> dict[str, int]:
    """How many of the file's matrices (the layers' linears, embedding, head) each block type holds."""
    from model.gguf.header import read_header

    counts: dict[str, int] = {}
    for tensor in read_header(path).tensors:
        if len(tensor.shape) == 2:
            counts[tensor.type_name] = counts.get(tensor.type_name, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def compare_file(path: Path, text: str, tokens: int, threads: int) -> dict[str, Any]:
    """One file's row of the report."""
    from model.gguf.header import read_header

    ids = text_ids(path, text, tokens)
    targets = np.array(ids[1:])
    started = time.perf_counter()
    ours, note = runtime_logits(path, ids)
    ours_s = time.perf_counter() - started
    reference = llama_cpp_logits(path, ids, threads)
    exact = exact_logits(path, ids)
    between = agreement(reference, ours, targets)
    ours_to_exact, llama_cpp_to_exact = agreement(exact, ours, targets), agreement(exact, reference, targets)
    return {"file": path.name, "architecture": read_header(path).architecture, "types": linear_types(path),
            "weights": "own blocks" if "on its own blocks" in note else "de-quantized", **asdict(between),
            "ppl_ratio": between.ppl_ratio, "ppl_exact": ours_to_exact.ppl_reference,
            "ours_to_exact": asdict(ours_to_exact), "llama_cpp_to_exact": asdict(llama_cpp_to_exact),
            "within_tolerance": within_tolerance(ours_to_exact, llama_cpp_to_exact, between),
            "ours_tokens_per_s": (len(ids) - 1) / ours_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, nargs="+", required=True, help="GGUF files")
    parser.add_argument("--text", type=Path, default=HELDOUT, help="held-out text (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=512, help="positions a file, at most its context")
    parser.add_argument("--threads", type=int, default=1,
                        help="both engines' (the logits do not depend on it; 1 spares a shared machine)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed: `make install-bench` builds it for this CPU")
        return 1

    set_torch_threads(args.threads)
    text = args.text.read_text()
    rows = []
    print(f"{'file':31} {'arch':6} {'types':24} {'top-1':>6} {'KL':>8} {'ppl ratio':>9} | vs exact: "
          f"{'top-1 ours':>10} {'l.cpp':>6} {'KL ours':>8} {'l.cpp':>8}")
    for path in args.model:
        row = compare_file(path, text, args.tokens, args.threads)
        rows.append(row)
        types = " ".join(f"{kind}x{count}" for kind, count in row["types"].items())
        ours, theirs = row["ours_to_exact"], row["llama_cpp_to_exact"]
        print(f"{row['file']:31} {row['architecture']:6} {types:24} {row['top1']:6.3f} {row['kl_mean']:8.5f} "
              f"{row['ppl_ratio']:9.4f} | {'':10}{ours['top1']:10.3f} {theirs['top1']:6.3f} "
              f"{ours['kl_mean']:8.5f} {theirs['kl_mean']:8.5f}"
              f"{'' if row['within_tolerance'] else '  OUT OF TOLERANCE'}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"text": str(args.text), "tokens": args.tokens, "threads": args.threads,
                  "tolerance": "this runtime at least as close to the exact network as llama.cpp (mean KL), "
                               f"perplexities within {MAX_PPL_RATIO_OFF:.0%}", "files": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(row["within_tolerance"] for row in rows) else 3


if __name__ == "__main__":
    raise SystemExit(main())
