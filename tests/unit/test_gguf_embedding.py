"""A GGUF's token embedding read from its own blocks (model/gguf/embedding.py): each looked-up row is the
de-quantized copy's row, value for value, in every type the tests' files hold; a model decoding on its own blocks
holds no dense copy of its vocabulary (a tied head the kernels read included) and answers as with the dense copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_answers import TEXTS, answer

from model.bundled.block_diffusion import _mean_embedding
from model.chat.engine import DiffusionChatModel
from model.chat.spec import ModelSpec
from model.gguf.embedding import BlockEmbedding, dense_rows
from model.gguf.header import read_header
from model.loading import load_chat_model
from model.runtime.int4_weights import available
from scripts.report_lib.gguf_parts import K_TYPES
from scripts.report_lib.tiny_gguf import K_SHAPE, write_model

T = GGMLQuantizationType
KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32")


@pytest.mark.parametrize("kind", KINDS)
def test_looked_up_rows_equal_the_de_quantized_copys_rows(tmp_path: Path, kind: str) -> None:
    path = write_model(tmp_path / f"{kind}.gguf", "qwen2", lambda name: T[kind] if "token_embd" in name else T.Q8_0,
                       shape=K_SHAPE if T[kind] in K_TYPES else None, seed=2).path
    header = read_header(path)
    info = header.tensor("token_embd.weight")
    assert info.type_name == kind
    dense = dense_rows(header, info, torch.bfloat16)
    embedding = BlockEmbedding(header, info, torch.bfloat16)
    ids = torch.tensor([[5, 0, 5, header.vocab_size - 1], [17, 3, 3, 200]])
    rows = embedding(ids)
    assert rows.dtype == torch.bfloat16 and rows.shape == (2, 4, dense.shape[1])
    assert torch.equal(rows, dense[ids])
    assert torch.equal(embedding.float()(ids), dense[ids].float())  # cast with the module, as a dense one is
    torch.testing.assert_close(_mean_embedding(embedding), dense.float().mean(0), rtol=0, atol=1e-6)
    with pytest.raises(IndexError):
        embedding(torch.tensor([header.vocab_size]))
    with pytest.raises(IndexError):
        embedding(torch.tensor([-1]))


@pytest.mark.skipif(available() is not None, reason=str(available()))
@pytest.mark.parametrize(("kind", "tied"), [("Q8_0", True), ("Q6_K", False)])
def test_a_model_on_its_own_blocks_holds_no_dense_embedding_and_answers_as_with_one(
    tmp_path: Path, kind: str, tied: bool
) -> None:
    def types(name: str) -> T:
        return T[kind] if "token_embd" in name else T.Q4_K if T[kind] in K_TYPES else T.Q8_0

    path = write_model(tmp_path / "m.gguf", "qwen2", types, tied=tied, seed=7,
                       shape=K_SHAPE if T[kind] in K_TYPES else None).path
    chat = load_chat_model(ModelSpec(source=str(path)))
    assert isinstance(chat, DiffusionChatModel)
    model = chat.backend.model  # type: ignore[attr-defined]
    base = model.base
    assert isinstance(base.get_input_embeddings(), BlockEmbedding)
    assert base.get_output_embeddings().weight.numel() == 0  # the head is the packed blocks, tied or not
    assert not any(p.numel() >= base.config.vocab_size * base.config.hidden_size for p in base.parameters())
    own = [answer(chat, text, 8)[1] for text in TEXTS]
    # the same file with the de-quantized copy swapped in, before its first answer (nothing cached yet)
    dense_chat = load_chat_model(ModelSpec(source=str(path)))
    assert isinstance(dense_chat, DiffusionChatModel)
    header = read_header(path)
    info = header.tensor("token_embd.weight")
    dense_base = dense_chat.backend.model.base  # type: ignore[attr-defined]
    dense_base.model.embed_tokens = torch.nn.Embedding.from_pretrained(dense_rows(header, info, torch.bfloat16))
    assert [answer(dense_chat, text, 8)[1] for text in TEXTS] == own


@pytest.mark.skipif(available() is not None, reason=str(available()))
def test_a_tied_head_the_kernels_do_not_read_keeps_its_dense_matrix(tmp_path: Path) -> None:
    path = write_model(tmp_path / "f.gguf", "llama", lambda name: T.F16 if "token_embd" in name else T.Q8_0).path
    base = load_chat_model(ModelSpec(source=str(path))).backend.model.base  # type: ignore[attr-defined]
    assert isinstance(base.get_input_embeddings(), torch.nn.Embedding)
    assert base.get_output_embeddings().weight is base.get_input_embeddings().weight
