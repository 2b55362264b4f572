"""scripts/bench/synthetic_gguf.py: a model's shape written with random blocks in llama.cpp's Q4_K_M mix (its
fallbacks for rows that are not whole super-blocks included), with the tests' vocabulary padded to the model's
size, that this runtime reads and decodes on its own blocks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType

from model.gguf.embedding import dense_rows
from model.gguf.header import read_header
from scripts.bench.synthetic_gguf import SHAPES, ModelShape, more_bits, tensor_type, write
from scripts.report_lib.gguf_parts import SPECIALS

T = GGMLQuantizationType


def test_the_q4_k_m_mix_is_llama_cpps_with_its_fallbacks() -> None:
    small, wide = SHAPES["qwen2.5-0.5b"], SHAPES["qwen2.5-1.5b"]
    assert [layer for layer in range(24) if more_bits(layer, 24)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]
    assert tensor_type("token_embd.weight", 1536, "Q4_K_M", wide) == T.Q6_K  # tied: the head's type
    assert tensor_type("blk.0.ffn_down.weight", 8960, "Q4_K_M", wide) == T.Q6_K
    assert tensor_type("blk.3.ffn_down.weight", 8960, "Q4_K_M", wide) == T.Q4_K
    assert tensor_type("blk.3.ffn_up.weight", 1536, "Q4_K_M", wide) == T.Q4_K
    assert tensor_type("token_embd.weight", 896, "Q4_K_M", small) == T.Q8_0  # 896 is not whole blocks of 256
    assert tensor_type("blk.3.ffn_up.weight", 896, "Q4_K_M", small) == T.Q5_0
    assert tensor_type("blk.3.ffn_up.weight", 896, "Q8_0", small) == T.Q8_0


def test_a_small_shape_is_written_with_its_types_vocabulary_and_weights_of_a_trained_size(tmp_path: Path) -> None:
    shape = ModelShape("qwen2", 256, 8, 4, 2, 512, 2000, True, 1e6, 4096)
    path = tmp_path / "s.gguf"
    write(shape, "Q4_K_M", path, seed=0)
    header = read_header(path)
    assert (header.architecture, header.layers, header.vocab_size, header.tied_head) == ("qwen2", 8, 2000, True)
    # ChatML's control tokens last, after the padding: <|endoftext|> (BOS), <|im_start|>, <|im_end|> (EOS)
    assert (header.token_id("bos"), header.token_id("eos")) == (2000 - len(SPECIALS), 1999)
    types = Counter(t.type_name for t in header.tensors)
    assert types == Counter({"Q4_K": 8 * 7 - 2 * 4, "Q6_K": 2 * 4 + 1, "F32": 8 * 5 + 1})  # layers 0, 3, 6, 7 more bits
    embedding = header.tensor("token_embd.weight")
    values = dense_rows(header, embedding, torch.float32)
    assert torch.isfinite(values).all() and 0.005 < float(values.std()) < 0.1
    down = header.tensor("blk.3.ffn_down.weight")
    assert 0.005 < float(np.std(dense_rows(header, down, torch.float32).numpy())) < 0.1
