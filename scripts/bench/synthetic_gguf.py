"""A GGUF of a real model's shape with random weights, for measuring memory and speed by model size offline.

    python scripts/bench/synthetic_gguf.py --shape qwen2.5-1.5b [--type Q4_K_M|Q8_0] [--out FILE] [--seed 0]

The time and memory of a decoding step do not depend on the weights' values, only on the shapes and block types:
this writes the tensors a llama.cpp conversion of the named model holds (llama or qwen2 layout, a tied head or not,
Qwen2's q/k/v biases), as random blocks with small scales (scripts/report_lib/gguf_parts.py: the unit tests' tiny
files are made of the same parts), in llama.cpp's type mix for `--type`. The vocabulary is the tests' byte-level BPE
padded to the model's size, with ChatML's control tokens last, so transformers and llama.cpp both load the file.
Answers are nonsense; random logits almost never pick the end token, so every answer runs to the token budget.

Q4_K_M follows llama.cpp's `llama_tensor_get_type`: Q4_K for the linears, Q6_K for attn_v and ffn_down in the
layers it gives more bits (the first and last eighth, every third between) and for the head (the embedding when
tied), and the fallback of a tensor whose rows are not whole super-blocks of 256 (Qwen2.5-0.5B's 896): Q5_0 for
Q4_K, Q8_0 for Q6_K. An untied embedding is Q4_K (as llama.cpp's), Q8_0 in a Q8_0 file.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from scripts.report_lib.gguf_parts import add_bpe_tokenizer, random_blocks, vocabulary

T = GGMLQuantizationType
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class ModelShape:
    architecture: str  # "llama" or "qwen2"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    rope_theta: float
    context: int


SHAPES = {
    "qwen2.5-0.5b": ModelShape("qwen2", 896, 24, 14, 2, 4864, 151936, True, 1_000_000.0, 32768),
    "qwen2.5-1.5b": ModelShape("qwen2", 1536, 28, 12, 2, 8960, 151936, True, 1_000_000.0, 32768),
    "llama-3.2-1b": ModelShape("llama", 2048, 16, 32, 8, 8192, 128256, True, 500_000.0, 131072),
}
# A weight's typical size is about 0.02 (random normal initialisations, trained models' linears): each type's block
# scale that gives it from random bytes (K-quants: the 6- or 8-bit sub-block scale multiplies it too)
_SCALE = {T.Q4_K: 1e-4, T.Q5_K: 5e-5, T.Q6_K: 2e-5, T.Q5_0: 2.5e-3, T.Q8_0: 3e-4}
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_0, T.Q6_K: T.Q8_0}  # rows not whole super-blocks of 256


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third one between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(name: str, cols: int, mix: str, shape: ModelShape) -> GGMLQuantizationType:
    """The type llama.cpp's quantizer gives tensor `name` (of rows of `cols`) in a `mix` file."""
    if mix == "Q8_0":
        return T.Q8_0
    part = name.split(".")[-2]
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    head = name == "output.weight" or (name == "token_embd.weight" and shape.tied)
    more = part in ("attn_v", "ffn_down") and more_bits(layer, shape.layers)
    kind = T.Q6_K if head or more else T.Q4_K
    return _FALLBACK[kind] if cols % 256 else kind


def write(shape: ModelShape, mix: str, path: Path, seed: int) -> None:
    """The file: metadata as llama.cpp's converter writes it for `shape.architecture`, then random tensors."""
    rng = np.random.default_rng(seed)
    head_dim = shape.hidden // shape.heads
    tokens, types = vocabulary(shape.vocab)
    writer = GGUFWriter(str(path), shape.architecture)
    writer.add_name(f"synthetic {shape.architecture} {shape.hidden}x{shape.layers} {mix}")
    writer.add_context_length(shape.context)
    writer.add_block_count(shape.layers)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(shape.vocab)
    add_bpe_tokenizer(writer, tokens, types)

    def linear(name: str, rows: int, cols: int) -> None:
        kind = tensor_type(name, cols, mix, shape)
        writer.add_tensor(name, random_blocks(kind, rows, cols, rng, _SCALE[kind]), raw_dtype=kind)

    def plain(name: str, values: np.ndarray) -> None:
        writer.add_tensor(name, values.astype(np.float32))

    q_size, kv_size = shape.heads * head_dim, shape.kv_heads * head_dim
    linear("token_embd.weight", shape.vocab, shape.hidden)
    for layer in range(shape.layers):
        blk = f"blk.{layer}"
        plain(f"{blk}.attn_norm.weight", 1 + 0.1 * rng.standard_normal(shape.hidden))
        linear(f"{blk}.attn_q.weight", q_size, shape.hidden)
        linear(f"{blk}.attn_k.weight", kv_size, shape.hidden)
        linear(f"{blk}.attn_v.weight", kv_size, shape.hidden)
        linear(f"{blk}.attn_output.weight", shape.hidden, q_size)
        if shape.architecture == "qwen2":
            for part, size in (("q", q_size), ("k", kv_size), ("v", kv_size)):
                plain(f"{blk}.attn_{part}.bias", 0.1 * rng.standard_normal(size))
        plain(f"{blk}.ffn_norm.weight", 1 + 0.1 * rng.standard_normal(shape.hidden))
        linear(f"{blk}.ffn_gate.weight", shape.intermediate, shape.hidden)
        linear(f"{blk}.ffn_up.weight", shape.intermediate, shape.hidden)
        linear(f"{blk}.ffn_down.weight", shape.hidden, shape.intermediate)
    plain("output_norm.weight", 1 + 0.1 * rng.standard_normal(shape.hidden))
    if not shape.tied:
        linear("output.weight", shape.vocab, shape.hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--type", dest="mix", choices=("Q4_K_M", "Q8_0"), default="Q4_K_M")
    parser.add_argument("--out", type=Path, default=None, help="default: artifacts/synthetic-SHAPE-TYPE.gguf")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = args.out or ROOT / "artifacts" / f"synthetic-{args.shape}-{args.mix}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    write(SHAPES[args.shape], args.mix, out, args.seed)
    print(f"{out}: {out.stat().st_size / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
