"""The int4 weights (model/runtime/int4_weights.py) of a GGUF whose linears are Q4_1 and whose head is Q8_0, as the
bundled model's file is: its blocks read as they lie in the file, q and k put back in HF's row order, packed for the
kernels, and kept packed in the cache after the first time (`cached_int4_weights`).

The tensors are found with the header walk (model/gguf/header.py) and read through a memory map, not with gguf-py's
`GGUFReader`, which parses the tokenizer's 49k strings first (5.7 s on two cores, on the first start's path,
against 1.6 s for the whole read and packing here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from model.errors import ModelError
from model.gguf.blocks import unpacked
from model.gguf.header import GGUFHeader, TensorInfo, read_header
from model.runtime.int4_weights import LAYOUT, Int4Layer, Int4Linear, Int4Weights, Q4Blocks, Q8Head, unpermute_order

# The GGUF's tensor names for one layer's linears, in HF's names
_GGUF_NAMES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
}


def read_q4_1(header: GGUFHeader, info: TensorInfo) -> Q4Blocks:
    """A Q4_1 tensor's blocks (`w = d q + m`), in the file's row order."""
    weight = unpacked(header, info)
    assert weight.m is not None  # Q4_1 has a minimum per group
    return Q4Blocks(weight.values.int(), weight.d, weight.m)


def read_q8_0(header: GGUFHeader, info: TensorInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor as (int8 values `[N, K]`, fp16 scales as fp32 `[N, K / 32]`), in the file's row order."""
    weight = unpacked(header, info)
    return weight.values.to(torch.int8), weight.d


def read_gguf_linears(path: Path, config: Any, header: GGUFHeader | None = None) -> list[dict[str, Q4Blocks]]:
    """Per layer, each linear's Q4_1 blocks in HF's row order (keys `q_proj` ... `down_proj`)."""
    header = header or read_header(path)
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    layers = []
    for index in range(int(config.num_hidden_layers)):
        weights = {}
        for hf_name, gguf_name in _GGUF_NAMES.items():
            name = f"blk.{index}.{gguf_name}.weight"
            info = header.tensor(name) if name in header.names else None
            if info is None or info.type_name != "Q4_1":
                kind = "missing" if info is None else info.type_name
                raise ModelError(f"{path.name}: {name} is {kind}, int4 weights need Q4_1")
            blocks = read_q4_1(header, info)
            if hf_name in ("q_proj", "k_proj"):
                blocks = blocks.rows(unpermute_order(blocks.q.shape[0], heads if hf_name == "q_proj" else kv_heads))
            weights[hf_name] = blocks
        layers.append(weights)
    return layers


def read_gguf_head(path: Path, header: GGUFHeader | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The LM head's Q8_0 (values, scales): the output weight, or the tied embedding; None when it is not Q8_0."""
    header = header or read_header(path)
    name = "output.weight" if "output.weight" in header.names else "token_embd.weight"
    info = header.tensor(name) if name in header.names else None
    return None if info is None or info.type_name != "Q8_0" else read_q8_0(header, info)


def int4_weights(path: Path, config: Any) -> Int4Weights:
    """The model's linears (fused for `model.runtime.fast_pass`) and LM head from the GGUF at `path`."""
    header = read_header(path)
    head = read_gguf_head(path, header)
    return Int4Weights(
        [Int4Layer.from_blocks(w) for w in read_gguf_linears(path, config, header)],
        None if head is None else Q8Head.from_q8_0(*head),
    )


def cached_int4_weights(gguf_path: Path, config: Any, cache_file: Path) -> Int4Weights:
    """`int4_weights`, kept packed in `cache_file` after the first time: reading the GGUF and packing it took 1.6 s
    on two cores, loading the packed tensors 0.02 s. The cache names the packed layout and the GGUF's size and time
    that made it, and is rebuilt when they change."""
    from safetensors.torch import load_file, save_file

    stat = gguf_path.stat()
    made_from = f"{gguf_path.name}:{stat.st_size}:{stat.st_mtime_ns}"
    stamp = {"layout": LAYOUT, "gguf": made_from}
    if cache_file.is_file():
        from safetensors import safe_open

        with safe_open(str(cache_file), "pt") as handle:
            fresh = handle.metadata() == stamp
        if fresh:
            return _unflatten(load_file(str(cache_file)))
    weights = int4_weights(gguf_path, config)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    partial = cache_file.with_name(cache_file.name + ".partial")
    save_file(_flatten(weights), str(partial), metadata=stamp)
    partial.replace(cache_file)
    return weights


def _flatten(weights: Int4Weights) -> dict[str, torch.Tensor]:
    flat = {}
    for index, layer in enumerate(weights.layers):
        for name, linear in (("qkv", layer.qkv), ("o", layer.o), ("gate_up", layer.gate_up), ("down", layer.down)):
            prefix = f"layers.{index}.{name}"
            flat.update({f"{prefix}.nibbles": linear.nibbles, f"{prefix}.d": linear.d, f"{prefix}.m": linear.m})
            flat[f"{prefix}.out_features"] = torch.tensor(linear.out_features)
    if weights.head is not None:
        flat.update({"head.q": weights.head.q, "head.d": weights.head.d})
        flat["head.out_features"] = torch.tensor(weights.head.out_features)
    return flat


def _unflatten(flat: dict[str, torch.Tensor]) -> Int4Weights:
    def linear(prefix: str) -> Int4Linear:
        parts = (flat[f"{prefix}.{part}"] for part in ("nibbles", "d", "m"))
        return Int4Linear(*parts, int(flat[f"{prefix}.out_features"]))

    count = len({key.split(".")[1] for key in flat if key.startswith("layers.")})
    layers = [Int4Layer(*(linear(f"layers.{i}.{n}") for n in ("qkv", "o", "gate_up", "down"))) for i in range(count)]
    head = Q8Head(flat["head.q"], flat["head.d"], int(flat["head.out_features"])) if "head.q" in flat else None
    return Int4Weights(layers, head)
