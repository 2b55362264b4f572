"""Tiny GGUF models written by the tests themselves (gguf-py's `GGUFWriter`), laid out as llama.cpp's converter lays
out llama, qwen2 and qwen3 files, with a byte-level BPE tokenizer and a ChatML template in the metadata.

`write_model` returns the weights as the file holds them, in transformers' names and layout, de-quantized by gguf-py:
what a loader must produce from the file, value for value.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType, TokenType
from gguf.quants import dequantize, quantize

from scripts.report_lib.gguf_parts import K_TYPES, add_bpe_tokenizer, random_blocks, vocabulary

# A sentencepiece vocabulary (TinyLlama's and Llama 2's kind: `tokenizer.ggml.model` "llama"): unknown, BOS, EOS, the
# byte fallbacks, then pieces by score; and the Zephyr template TinyLlama's chat models use (EOS ends a message)
SPM_PIECES = ("▁", "▁t", "he", "▁the", "▁h", "e", "h", "t", "l", "o", "▁hello", "ll", "w", "r", "d")
ZEPHYR = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def spm_vocabulary() -> tuple[list[str], list[int], list[float]]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), *SPM_PIECES]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, *[TokenType.BYTE] * 256,
             *[TokenType.NORMAL] * len(SPM_PIECES)]
    scores = [0.0] * (3 + 256) + [-float(rank) for rank in range(len(SPM_PIECES))]
    return tokens, [int(t) for t in types], scores


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 128
    layers: int = 2


# Rows of 256 for the K-quants' super-blocks
K_SHAPE = Shape(hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=256)


@dataclass
class TinyModel:
    path: Path
    architecture: str
    weights: dict[str, np.ndarray] = field(default_factory=dict)  # transformers' names, fp32, as the file holds them
    rope_factors: np.ndarray | None = None


def permute_for_llama(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's reordering of q and k rows for its rotation (convert_hf_to_gguf.py, LlamaModel)."""
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def _quantized(values: np.ndarray, qtype: GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray]:
    """(what the file holds, its de-quantization by gguf-py)."""
    if qtype in K_TYPES:
        raise ValueError("K-quants are written by random_blocks")
    stored = quantize(values, qtype)
    return stored, dequantize(stored, qtype).reshape(values.shape).astype(np.float32)


def write_model(
    path: Path,
    architecture: str = "llama",
    qtype: GGMLQuantizationType | Callable[[str], GGMLQuantizationType] = GGMLQuantizationType.Q8_0,
    tied: bool = True,
    seed: int = 0,
    shape: Shape | None = None,
    rope_factors: bool = False,
    linear_rope: float | None = None,
    tokenizer: str = "gpt2",
    eos: str = "<|im_end|>",
    layer_scale: float = 0.2,
) -> TinyModel:
    """A random model of `architecture` whose linear layers and embedding are stored as `qtype` (or `qtype(name)`
    per tensor, as a "Q4_K_M" file mixes them; norms, biases and rope factors F32, as llama.cpp stores them), with a
    byte-level BPE tokenizer and ChatML (`tokenizer` "gpt2") or a sentencepiece one and Zephyr's template ("llama").
    `layer_scale`: the layers' linears' standard deviation (the embedding's is 0.2); near 0, each token's own embedding
    dominates its logits, and greedy answers repeat the prompt's last token."""
    shape = shape or Shape()
    rng = np.random.default_rng(seed)
    tokens, types = spm_vocabulary()[:2] if tokenizer == "llama" else vocabulary()
    vocab = len(tokens)
    model = TinyModel(path, architecture)
    writer = GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny {architecture}")
    writer.add_context_length(512)
    writer.add_block_count(shape.layers)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    if architecture == "qwen3":
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    else:
        writer.add_rope_dimension_count(shape.head_dim)
    if linear_rope is not None:
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(linear_rope)
    if tokenizer == "llama":
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_scores(spm_vocabulary()[2])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        writer.add_add_bos_token(True)
        writer.add_chat_template(ZEPHYR)
    else:
        add_bpe_tokenizer(writer, tokens, types, eos)

    def linear(gguf_name: str, hf_name: str, rows: int, cols: int, permute_heads: int | None = None) -> None:
        kind = qtype(gguf_name) if callable(qtype) else qtype
        if kind in K_TYPES:
            stored = random_blocks(kind, rows, cols, rng)
            values = dequantize(stored, kind).reshape(rows, cols).astype(np.float32)
            writer.add_tensor(gguf_name, stored, raw_dtype=kind)
            if permute_heads is not None:  # the file holds llama.cpp's order: transformers undoes it
                values = _unpermute(values, permute_heads)
            model.weights[hf_name] = values
            return
        scale = 0.2 if gguf_name.startswith(("token_embd", "output")) else layer_scale
        values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        stored_values = permute_for_llama(values, permute_heads) if permute_heads is not None else values
        stored, restored = _quantized(stored_values, kind)
        writer.add_tensor(gguf_name, stored, raw_dtype=kind)
        model.weights[hf_name] = _unpermute(restored, permute_heads) if permute_heads is not None else restored

    def plain(gguf_name: str, hf_name: str, values: np.ndarray) -> None:
        writer.add_tensor(gguf_name, values.astype(np.float32))
        model.weights[hf_name] = values.astype(np.float32)

    q_size, kv_size = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    linear("token_embd.weight", "model.embed_tokens.weight", vocab, shape.hidden)
    for layer in range(shape.layers):
        blk, hf = f"blk.{layer}", f"model.layers.{layer}"
        llama = architecture == "llama"
        plain(f"{blk}.attn_norm.weight", f"{hf}.input_layernorm.weight", 1 + 0.1 * rng.standard_normal(shape.hidden))
        linear(f"{blk}.attn_q.weight", f"{hf}.self_attn.q_proj.weight", q_size, shape.hidden,
               shape.heads if llama else None)
        linear(f"{blk}.attn_k.weight", f"{hf}.self_attn.k_proj.weight", kv_size, shape.hidden,
               shape.kv_heads if llama else None)
        linear(f"{blk}.attn_v.weight", f"{hf}.self_attn.v_proj.weight", kv_size, shape.hidden)
        linear(f"{blk}.attn_output.weight", f"{hf}.self_attn.o_proj.weight", shape.hidden, q_size)
        if architecture == "qwen2":
            for name, size in (("q", q_size), ("k", kv_size), ("v", kv_size)):
                plain(f"{blk}.attn_{name}.bias", f"{hf}.self_attn.{name}_proj.bias", 0.1 * rng.standard_normal(size))
        if architecture == "qwen3":
            for name in ("q", "k"):
                plain(f"{blk}.attn_{name}_norm.weight", f"{hf}.self_attn.{name}_norm.weight",
                      1 + 0.1 * rng.standard_normal(shape.head_dim))
        plain(f"{blk}.ffn_norm.weight", f"{hf}.post_attention_layernorm.weight",
              1 + 0.1 * rng.standard_normal(shape.hidden))
        linear(f"{blk}.ffn_gate.weight", f"{hf}.mlp.gate_proj.weight", shape.intermediate, shape.hidden)
        linear(f"{blk}.ffn_up.weight", f"{hf}.mlp.up_proj.weight", shape.intermediate, shape.hidden)
        linear(f"{blk}.ffn_down.weight", f"{hf}.mlp.down_proj.weight", shape.hidden, shape.intermediate)
    plain("output_norm.weight", "model.norm.weight", 1 + 0.1 * rng.standard_normal(shape.hidden))
    if not tied:
        linear("output.weight", "lm_head.weight", vocab, shape.hidden)
    if rope_factors:
        model.rope_factors = (1 + rng.integers(0, 8, shape.head_dim // 2)).astype(np.float32)
        writer.add_tensor("rope_freqs.weight", model.rope_factors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _unpermute(values: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `permute_for_llama`."""
    return values.reshape(heads, values.shape[0] // heads // 2, 2, *values.shape[1:]).swapaxes(1, 2).reshape(
        values.shape)


def ollama_layout(root: Path, gguf: Path, name: str = "tiny", tag: str = "latest", namespace: str = "library") -> Path:
    """`root` laid out as Ollama's model store holding `gguf` as `name:tag`: the blob, and a manifest naming it
    beside the other layers Ollama writes (template, params). Returns the blob."""
    digest = "a1b2c3d4" * 8
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gguf, blob)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "0" * 64},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 1},
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 1},
            {"mediaType": "application/vnd.ollama.image.params", "digest": "sha256:" + "2" * 64, "size": 1},
        ],
    }
    path = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob
