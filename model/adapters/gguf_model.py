"""A user's own GGUF model (llama, qwen2, qwen3: what Ollama and LM Studio keep) as a chat model that decodes
through the bundled model's back end: self-speculatively with a draft adapter made for it (`dlm adapt`; found by
`ModelSpec`, model/gguf/draft_adapter.py), autoregressively without.

transformers builds the tokenizer and the config from the file's metadata (once: model/gguf/text_config.py), the
network gets the file's tensors de-quantized to `spec.precision` (bf16 by default; model/gguf/network.py), and it
runs inside a `BlockDiffusionLM` (with the draft adapter's gated LoRA, or none), so its answers are passes of the same
`BlockDiffusionBackend` as the bundled model's: batched across answers, the KV cache kept between turns and the next
prompt encoded ahead, the end-of-turn probe on the template's own end-of-message token. Without a draft adapter the
only lossless mode is autoregressive: one token a pass, each the model's own greedy (or sampled) choice; with one,
the LoRA acts on the mask rows only, so the clean rows (and so every accepted token) are the model's own, as the
bundled model's are.

On a CPU, when the kernels read every layer's block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K:
model/gguf/blocks.py), the passes multiply by the file's own blocks through the fused pass and the C decode layer, as
the bundled model's do (`use_int4`, the adapter's LoRA added on the mask rows), and the dense copies of the linears
are dropped, and the token embedding reads the rows it looks up from the file's blocks (model/gguf/embedding.py;
a tied head of a type the kernels do not read keeps its de-quantized matrix); otherwise (F16/BF16/F32 layers, a GPU,
`--weights bf16`) by the de-quantized weights, the embedding among them.

What transformers does not read from the file is applied here: Llama 3's rope frequency factors (`rope_freqs.weight`)
and linear rope scaling, both a division of the rotary frequencies, as llama.cpp applies them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.bundled.backend import BlockDiffusionBackend
from model.bundled.block_diffusion import AdapterConfig, BlockDiffusionLM, load_adapter
from model.bundled.default_model import adapter_meta, card_sampler
from model.chat.engine import DiffusionChatModel, context_length_of
from model.chat.spec import ModelSpec
from model.decoding.sampler import SamplerConfig
from model.device import resolve_device
from model.errors import ModelError
from model.gguf.blocks import FORMATS, gguf_weights, unreadable
from model.gguf.embedding import BlockEmbedding
from model.gguf.header import GGUFHeader
from model.gguf.locate import OLLAMA_PREFIX
from model.gguf.network import dense_network, network_without_linears
from model.gguf.text_config import tokenizer_and_config
from model.runtime import quant_kernels

ROPE_FACTORS = "rope_freqs.weight"
# One token a pass: the block the answer's length is rounded to, and the pass budget of a block
AUTOREGRESSIVE = SamplerConfig(block_length=1, steps_per_block=1, decoding="autoregressive")


def load_gguf_chat_model(spec: ModelSpec) -> DiffusionChatModel:
    """The GGUF model `spec.gguf` names (checked by `ModelSpec`), ready to answer: with its draft adapter
    (`spec.draft_adapter`: a gated LoRA, a drafter on its hidden rows, or both) self-speculatively by default, as the
    bundled model; without, autoregressively. Raises ModelError."""
    header = spec.gguf
    if header is None or spec.source is None:
        raise ModelError("load_gguf_chat_model needs a ModelSpec whose source is a GGUF")
    folder = spec.draft_adapter
    lora = folder if folder is not None and (folder / "adapter.json").is_file() else None
    drafter = folder if folder is not None and (folder / "drafter.json").is_file() and spec.decoding.drafter else None
    device = resolve_device(spec.device)
    dtype = torch.float32 if spec.precision == "fp32" else torch.bfloat16
    why_not = _why_not_own_blocks(spec, header, device, dtype)
    unused = None
    if drafter is not None and why_not is not None:  # a drafter reads the rows the decode kernel computes
        unused, drafter = f"its drafter is not used: the passes do not run on the file's blocks ({why_not})", None
    own = adapter_sampler(lora) if lora else drafter_sampler(drafter) if drafter else AUTOREGRESSIVE
    sampler = spec.decoding.apply(own)
    if own is not AUTOREGRESSIVE and sampler.block_length != own.block_length:
        raise ModelError(f"the draft adapter in {folder} was trained with blocks of {own.block_length} tokens: leave "
                         "--block-length unset")
    if lora is None and sampler.decoding == "diffusion":
        raise ModelError(f"{header.path.name} decodes by diffusion only with a draft adapter's LoRA (`dlm adapt` "
                         "without --drafter)")
    if lora is None and drafter is None and sampler.decoding != "autoregressive":
        raise ModelError(f"{header.path.name} decodes {sampler.decoding} only with a draft adapter it can use: "
                         f"{unused or 'none here'}")
    tokenizer, base, ends = _network(header, dtype, dense_linears=why_not is not None)
    if lora is None:
        model = BlockDiffusionLM(base, AdapterConfig(block_length=1, targets=()))
    else:
        model = load_adapter(base, lora)
        model.cast_adapter(torch.float32)  # fp32 factors, as the bundled model's: thin matmuls run faster on a CPU
    model.eval()
    model.to(device)
    if why_not is None:
        model.use_int4(gguf_weights(header, base.get_output_embeddings().weight.detach()))
        return_freed_memory()
    name = spec.source.removeprefix(OLLAMA_PREFIX) if spec.source.startswith(OLLAMA_PREFIX) else header.path.stem
    weights = ("on its own blocks" if why_not is None
               else f"de-quantized to {str(dtype).removeprefix('torch.')} ({why_not})")
    note = f"{name} decodes {decoding_words(sampler)} ({_drafts(folder, lora, drafter, unused)}); " \
           f"{header.describe()}, {weights}"
    backend = BlockDiffusionBackend(model, ends, spec.max_batch)
    if drafter is not None:
        backend.load_drafter(drafter, head_rows(header))
    chat = DiffusionChatModel(name, tokenizer, backend, sampler, spec.system_prompt, context_length_of(base.config),
                              note)
    model.inference_pass()  # the fused pass built now, not on the first answer
    chat.vocabulary()  # scanned now rather than on the first answer's critical path
    return chat


def adapter_sampler(adapter: Path) -> SamplerConfig:
    """A draft adapter's decoding settings: its card's (adapter.json), self-speculative by default."""
    return card_sampler(adapter_meta(adapter))


def _drafts(folder: Path | None, lora: Path | None, drafter: Path | None, unused: str | None) -> str:
    """What drafts a GGUF's answers, in words for its note."""
    if folder is None:
        return "no draft adapter: make one with `dlm adapt`"
    if lora is not None:
        return f"draft adapter {folder}" + (", with its drafter" if drafter is not None else "")
    return f"drafter {folder}" if drafter is not None else unused or f"{folder} unused"


def head_rows(header: GGUFHeader) -> BlockEmbedding:
    """The file's head rows of token ids `[S]` -> `[S, hidden]` fp32, de-quantized from its blocks as they are
    looked up (the decoding network holds its head as blocks): a drafter's shortlist."""
    name = "token_embd.weight" if header.tied_head else "output.weight"
    return BlockEmbedding(header, header.tensor(name), torch.float32)


def drafter_sampler(folder: Path) -> SamplerConfig:
    """A drafter's decoding settings (drafter.json): self-speculative, as many drafts a pass as the policy finds pay,
    up to its block."""
    block = int(json.loads((folder / "drafter.json").read_text())["drafter"]["block"])
    return SamplerConfig(block_length=block, steps_per_block=block, decoding="self-speculative", draft_masks=block,
                         draft_layout="adaptive")


def decoding_words(sampler: SamplerConfig) -> str:
    return {"autoregressive": "autoregressively", "self-speculative": "self-speculatively",
            "diffusion": "by diffusion"}.get(sampler.decoding, sampler.decoding)


def load_dense_teacher(header: GGUFHeader, dtype: torch.dtype) -> tuple[Any, Any, set[int]]:
    """(tokenizer, causal LM, end ids) of the file with every tensor de-quantized to `dtype`: what `dlm adapt` trains
    on (model/training/adapt.py), with the same rope, BOS and end-of-answer handling as the decoding model."""
    return _network(header, dtype, dense_linears=True)


def _network(header: GGUFHeader, dtype: torch.dtype, dense_linears: bool) -> tuple[Any, Any, set[int]]:
    """(tokenizer, causal LM, end ids) of the file (`_from_file`) with what transformers does not read from it
    applied: the rope's frequency divisors, the BOS the file asks for, the template's end of a message."""
    tokenizer, base = _from_file(header, dtype, dense_linears)
    divide_rope_frequencies(base, rope_frequency_divisors(header))
    begin_with_bos(tokenizer, header)
    return tokenizer, base, end_ids(tokenizer, header)


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`; nothing elsewhere). Loading frees the
    de-quantized copies of the linears in many mid-sized pieces that glibc keeps in its arenas: for SmolLM2-135M the
    process stayed at ~870 MB after dropping them, ~560 MB after this."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _why_not_own_blocks(spec: ModelSpec, header: GGUFHeader, device: torch.device, dtype: torch.dtype) -> str | None:
    """None when the passes can multiply by the file's own blocks, else why not (one phrase)."""
    if spec.weights == "bf16" or dtype != torch.bfloat16:
        return "as asked"
    if device.type != "cpu":
        return "the block kernels are CPU ones"
    missing = quant_kernels.unavailable()
    if missing is not None:
        return missing
    others = unreadable(header)
    if others:
        return f"the kernels read {', '.join(FORMATS)} layers, not {others[0]}"
    return None


def _from_file(header: GGUFHeader, dtype: torch.dtype, dense_linears: bool) -> tuple[Any, Any]:
    """transformers' tokenizer and causal LM of the file (model/gguf/network.py), de-quantized to `dtype`; without
    `dense_linears`, the layers' linears empty and the head too when the kernels read it: the packed blocks serve the
    passes."""
    try:
        tokenizer, config = tokenizer_and_config(header)
        # transformers reads no head width for qwen3 (its config's default, 128, is every released Qwen3's): the
        # file's own (`attention.key_length`) for every architecture
        config.head_dim = header.head_dim
        if dense_linears:
            return tokenizer, dense_network(header, config, dtype)
        config.tie_word_embeddings = header.tied_head
        head = "token_embd.weight" if header.tied_head else "output.weight"
        packed_head = header.tensor(head).type_name in FORMATS
        return tokenizer, network_without_linears(header, config, dtype, packed_head)
    except (ValueError, KeyError, OSError, RuntimeError) as error:
        raise ModelError(f"transformers cannot load {header.path}: {error}") from error


def rope_frequency_divisors(header: GGUFHeader) -> np.ndarray | None:
    """What each rotary frequency is divided by (`[head_dim / 2]`), as llama.cpp does: Llama 3's `rope_freqs.weight`
    factors times a linear scaling's factor; None when neither is there."""
    kind, factor = header.rope_scaling
    divisors = np.full(header.head_dim // 2, factor if kind == "linear" else 1.0, dtype=np.float32)
    found = [t for t in header.tensors if t.name == ROPE_FACTORS]
    if found:
        info = found[0]
        if info.type_name != "F32" or info.shape != (header.head_dim // 2,):
            raise ModelError(f"{header.path}: {ROPE_FACTORS} is {info.type_name} {info.shape}, expected F32 "
                             f"({header.head_dim // 2},)")
        factors = np.fromfile(header.path, dtype=np.float32, count=info.shape[0],
                              offset=header.data_start + info.offset)
        divisors *= factors
    return None if np.all(divisors == 1.0) else divisors


def divide_rope_frequencies(base: Any, divisors: np.ndarray | None) -> None:
    """Divide the rotary embedding's inverse frequencies (the buffer every layer's rotation reads) by `divisors`."""
    if divisors is None:
        return
    rotary = base.model.rotary_emb
    scaled = rotary.inv_freq / torch.from_numpy(divisors).to(rotary.inv_freq)
    rotary.inv_freq.copy_(scaled)
    rotary.original_inv_freq = scaled.clone()


def begin_with_bos(tokenizer: Any, header: GGUFHeader) -> None:
    """Make the chat template write the BOS token when the file asks for one (`tokenizer.ggml.add_bos_token`, true by
    default for sentencepiece vocabularies) and the template does not write it: llama.cpp puts it before every prompt,
    while the chat engine encodes the template's text as it is (TinyLlama's Zephyr template has no BOS; Llama 3's
    writes its own)."""
    stated = header.metadata.get("tokenizer.ggml.add_bos_token")
    wanted = bool(stated) if stated is not None else header.metadata.get("tokenizer.ggml.model") == "llama"
    bos = tokenizer.bos_token
    template = getattr(tokenizer, "chat_template", None)
    if not wanted or not bos or not isinstance(template, str):
        return
    text = tokenizer.apply_chat_template([{"role": "user", "content": "a"}], tokenize=False)
    if not text.startswith(bos):
        tokenizer.chat_template = "{{ bos_token }}" + template


def end_ids(tokenizer: Any, header: GGUFHeader) -> set[int]:
    """The tokens that end an answer: the file's EOS, end-of-turn and end-of-message ids, and the chat template's own
    end of a message, which also becomes the tokenizer's EOS: the chat engine's end-of-turn probe and guards read it
    (Llama 3 files name `<|end_of_text|>` as EOS while their template ends a message with `<|eot_id|>`)."""
    ids = {token for token in (header.token_id("eos"), header.token_id("eot"), header.token_id("eom"))
           if token is not None}
    end = template_end(tokenizer)
    if end is not None:
        ids.add(end)
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(end)
    if not ids:
        raise ModelError(f"{header.path}: no end-of-sequence token in its metadata or chat template")
    return ids


def template_end(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after a user message's words (`<|im_end|>`, `<|eot_id|>`),
    or None when it writes none there (or has no template)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    words = "Is it done"
    text = tokenizer.apply_chat_template([{"role": "user", "content": words}], tokenize=False)
    at = text.rfind(words)
    if at < 0:
        return None
    after = tokenizer.encode(text[at + len(words):], add_special_tokens=False)
    # the file's control tokens (transformers adds them as special added tokens; `all_special_ids` lists only the
    # named ones: BOS, EOS, unknown, padding)
    special = {index for index, token in tokenizer.added_tokens_decoder.items() if token.special}
    return after[0] if after and after[0] in special | set(tokenizer.all_special_ids) else None
