"""A GGUF model's network built without de-quantizing its linear layers: for a model whose passes multiply by the
file's own blocks (model/gguf/blocks.py), so that loading it never holds a dense copy of them.

transformers' GGUF loader de-quantizes every tensor to fp32 before casting it (a 1.5B model passes through ~6 GB);
here the network is laid out on the meta device, its linears get empty weights, the token embedding reads the
file's rows as they are looked up (model/gguf/embedding.py), and only the small tensors (norms, biases, Qwen3's q/k
norms) and a head the kernels do not read are de-quantized from the file (gguf-py), as transformers' loader would give
them: llama.cpp's converter permutes only the q and k weights, which model/gguf/blocks.py puts back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from model.errors import ModelError
from model.gguf.blocks import rotary_permuted
from model.gguf.embedding import BlockEmbedding, dense_rows
from model.gguf.header import GGUFHeader
from model.runtime.int4_weights import unpermute_order

_EMBEDDING = "model.embed_tokens.weight"
_GLOBAL = {"token_embd.weight": _EMBEDDING, "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}
_SKIPPED = ("rope_freqs.weight",)  # applied to the rotary frequencies (model/adapters/gguf_model.py)


def hf_name(name: str) -> str | None:
    """transformers' name of a GGUF tensor the network holds densely; None for the linears and skipped ones."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk":
        if parts[2] in _LAYER:
            return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}"
        if parts[2].removesuffix(".weight") in _LINEARS:
            return None
    if name in _SKIPPED:
        return None
    raise ModelError(f"{name}: a tensor this runtime does not place")


def _dense(header: GGUFHeader, name: str, dtype: torch.dtype) -> torch.Tensor:
    """The tensor de-quantized by gguf-py (as transformers' loader does), in `dtype`."""
    info = header.tensor(name)
    return dense_rows(header, info, dtype).reshape(info.shape[::-1])


def network_without_linears(header: GGUFHeader, config: Any, dtype: torch.dtype, packed_head: bool) -> Any:
    """transformers' causal LM for `config` with every layer's linears empty (`[0, in]`), the token embedding read
    from the file's blocks row by row (model/gguf/embedding.py), and the other tensors de-quantized from the file to
    `dtype`; the head too unless `packed_head` (then it is empty). A tied head the kernels do not read (F16, BF16,
    F32) is multiplied by the dense matrix (`RowByRowHead`): that embedding stays a de-quantized copy, the head's."""
    with torch.device("meta"):
        base = _module(config, dtype)
    for layer in base.model.layers:
        for path in _LINEARS.values():
            module: nn.Linear = layer.get_submodule(path)
            module.weight = nn.Parameter(torch.empty(0, module.in_features, dtype=dtype), requires_grad=False)
    dense_embedding = header.tied_head and not packed_head
    if not dense_embedding:
        base.model.embed_tokens = BlockEmbedding(header, header.tensor("token_embd.weight"), dtype)
    _allocate(base, config)
    state = {}
    for info in header.tensors:
        name = hf_name(info.name)
        if (name is None or (name == "lm_head.weight" and packed_head)
                or (name == _EMBEDDING and not dense_embedding)):
            continue
        state[name] = _dense(header, info.name, dtype)
    if dense_embedding:
        base.lm_head.weight = base.model.embed_tokens.weight
    elif packed_head:
        base.lm_head.weight = nn.Parameter(torch.empty(0, base.lm_head.in_features, dtype=dtype), requires_grad=False)
    missing, unexpected = base.load_state_dict(state, strict=False)
    linears = {f"model.layers.{i}.{path}.weight" for i in range(header.layers) for path in _LINEARS.values()}
    _check_loaded(header, [key for key in missing if key not in linears and key != "lm_head.weight"], unexpected)
    base.eval()
    return base


def dense_network(header: GGUFHeader, config: Any, dtype: torch.dtype) -> Any:
    """transformers' causal LM for `config` with every tensor of the file de-quantized to `dtype` (gguf-py, as
    transformers' loader does), q and k put back in HF's row order: what `from_pretrained(gguf_file=)` gives, without
    its per-tensor name lookups and its second parse of the header (SmolLM2's file: ~27 s there on two cores)."""
    config.tie_word_embeddings = header.tied_head
    with torch.device("meta"):
        base = _module(config, dtype)
    _allocate(base, config)
    permuted = rotary_permuted(header)
    state = {}
    for info in header.tensors:
        if info.name in _SKIPPED:
            continue
        name = hf_name(info.name)
        if name is None:  # a layer's linear
            _, layer, part, _ = info.name.split(".")
            name = f"model.layers.{layer}.{_LINEARS[part]}.weight"
            state[name] = _linear(header, info.name, permuted, dtype)
        else:
            state[name] = _dense(header, info.name, dtype)
    if header.tied_head:
        state.pop("lm_head.weight", None)
    missing, unexpected = base.load_state_dict(state, strict=False)
    if header.tied_head:
        base.lm_head.weight = base.model.embed_tokens.weight
    _check_loaded(header, [key for key in missing if not (header.tied_head and key == "lm_head.weight")], unexpected)
    base.eval()
    return base


def dense_linears(header: GGUFHeader, layer: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Layer `layer`'s linears de-quantized to `dtype`, by transformers' path in the layer (`self_attn.q_proj`, ...,
    `mlp.down_proj`), q and k in HF's row order: one layer of `dense_network` without the rest."""
    permuted = rotary_permuted(header)
    return {path: _linear(header, f"blk.{layer}.{part}.weight", permuted, dtype) for part, path in _LINEARS.items()}


def _linear(header: GGUFHeader, name: str, permuted: dict[str, int], dtype: torch.dtype) -> torch.Tensor:
    """A layer's linear `blk.N.PART.weight` de-quantized, its rows put back in HF's order where the file permuted
    them for its rotary layout (`permuted`: `rotary_permuted`)."""
    tensor = _dense(header, name, dtype)
    part = name.split(".")[2]
    return tensor[unpermute_order(tensor.shape[0], permuted[part])] if part in permuted else tensor


def _module(config: Any, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def _allocate(base: Any, config: Any) -> None:
    """Give a network laid out on the meta device its CPU storage; the rotary frequencies computed again there."""
    rotary_type = type(base.model.rotary_emb)
    base.to_empty(device="cpu")
    base.model.rotary_emb = rotary_type(config=config)


def _check_loaded(header: GGUFHeader, missing: list[str], unexpected: list[str]) -> None:
    if missing or unexpected:
        raise ModelError(f"{header.path}: tensors missing from the file {missing[:3]} or not in the network "
                         f"{unexpected[:3]}")
