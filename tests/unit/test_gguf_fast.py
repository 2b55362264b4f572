"""A user's GGUF model on its own blocks in the fast runtime: the fused pass and the C decode layer (Qwen2's biases,
Qwen3's q/k norms, no adapter) against the torch fused pass on the same kernels, and answers through the C path the
same whether batched with others or alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_answers import answer, assert_batched_answers_equal_lone_answers

from model.chat import ChatMessage
from model.chat.engine import DiffusionChatModel
from model.chat.spec import ModelSpec
from model.loading import load_chat_model
from model.runtime import batch_runner
from model.runtime.batching import Feed, SlotCache, batched_pass, prefill
from model.runtime.int4_weights import available
from model.runtime.packed import PackedLinear
from scripts.report_lib.tiny_gguf import K_SHAPE, write_model

T = GGMLQuantizationType
pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


def mixed(name: str) -> T:
    """A mix of the kernels' formats, as a quantizer's "_M" mixes give some tensors more bits."""
    if "attn_v" in name or "ffn_down" in name:
        return T.Q5_1
    return T.Q8_0 if "token_embd" in name or "attn_k" in name else T.Q4_0


def q4_k_m(name: str) -> T:
    """What llama.cpp's Q4_K_M mix holds: Q6_K for some v and down projections and the head, Q4_K elsewhere."""
    if "token_embd" in name:
        return T.Q8_0
    if name == "output.weight" or "blk.1.ffn_down" in name or "blk.0.attn_v" in name:
        return T.Q6_K
    return T.Q5_K if "attn_k" in name else T.Q4_K


def load(path: Path, precision: str = "bf16") -> DiffusionChatModel:
    chat = load_chat_model(ModelSpec(source=str(path), precision=precision))
    assert isinstance(chat, DiffusionChatModel)
    return chat


def pass_logits(model) -> torch.Tensor:
    """fp32 logits `[4, V]` of a pass of 4 clean rows after a prefill of 33 tokens."""
    tokens = [3 + (7 * i) % 250 for i in range(37)]
    cache = SlotCache(1)
    prefill(model, cache, 0, tokens[:-4])
    [(clean, _)] = batched_pass(model, cache, [0], [Feed(clean=tuple(tokens[-4:]))])
    return clean.float()


@pytest.mark.parametrize(("architecture", "qtype", "tied"), [
    ("llama", mixed, True), ("qwen2", T.Q4_0, False), ("qwen3", mixed, True), ("qwen3", T.Q8_0, False),
    ("llama", q4_k_m, False), ("qwen2", q4_k_m, False),
])
def test_the_decode_layer_computes_the_torch_fused_pass(
    tmp_path: Path, architecture: str, qtype: T | Callable[[str], T], tied: bool
) -> None:
    """The C layer (fp32 residual, bf16 cache) against the torch pass on the same packed kernels in fp32: equal up
    to the cache's bf16 rounding and the activations' roundings it moves. A layer computed wrong (no bias, no q/k
    norm, q and k rows in the file's order) falls far below these bounds."""
    shape = K_SHAPE if qtype is q4_k_m else None
    chat = load(write_model(tmp_path / "m.gguf", architecture, qtype, tied, seed=4, shape=shape).path)
    model = chat.backend.model  # type: ignore[attr-defined]
    assert chat.note is not None and "on its own blocks" in chat.note
    assert model.inference_pass().native is not None
    assert isinstance(model.int4.layers[0].qkv, PackedLinear)
    assert model.base.model.layers[0].mlp.up_proj.weight.numel() == 0  # no dense copy of the packed linears
    native = pass_logits(model)
    model.base.float()
    model.use_int4(model.int4)  # an fp32 model: the torch pass, on the same packed kernels in fp32
    assert model.inference_pass().native is None
    reference = pass_logits(model)
    assert torch.nn.functional.cosine_similarity(native, reference, dim=-1).min() > 0.999
    assert torch.equal(native.argmax(-1), reference.argmax(-1))


def test_the_packed_passes_compute_the_de_quantized_network(tmp_path: Path) -> None:
    """The same file de-quantized (fp32 modules, transformers' own forward through the fused torch pass): the packed
    passes' logits are the same network's."""
    path = write_model(tmp_path / "q.gguf", "qwen2", mixed, tied=True, seed=6).path
    packed = pass_logits(load(path).backend.model)  # type: ignore[attr-defined]
    dense = pass_logits(load(path, precision="fp32").backend.model)  # type: ignore[attr-defined]
    assert torch.nn.functional.cosine_similarity(packed, dense, dim=-1).min() > 0.999


def test_a_head_the_kernels_do_not_read_is_multiplied_row_by_row(tmp_path: Path) -> None:
    path = write_model(tmp_path / "h.gguf", "llama",
                       lambda name: T.F16 if name == "output.weight" else T.Q8_0, tied=False, seed=8).path
    chat = load(path)
    model = chat.backend.model  # type: ignore[attr-defined]
    assert model.inference_pass().native is not None and not isinstance(model.int4.head, PackedLinear)
    _, tokens = answer(chat, "hello the world", 6)
    assert len(tokens) >= 1


def test_layers_the_kernels_do_not_read_decode_de_quantized(tmp_path: Path) -> None:
    path = write_model(tmp_path / "f.gguf", "llama", lambda name: T.F16 if "ffn_up" in name else T.Q8_0).path
    chat = load(path)
    assert chat.note is not None and "de-quantized to bfloat16 (the kernels read" in chat.note
    assert chat.backend.model.int4 is None  # type: ignore[attr-defined]


def test_answers_through_the_c_path_batched_equal_their_lone_answers(tmp_path: Path) -> None:
    chat = load(write_model(tmp_path / "b.gguf", "qwen3", mixed, tied=False, seed=5).path)
    assert chat.backend.model.inference_pass().native is not None  # type: ignore[attr-defined]
    assert_batched_answers_equal_lone_answers(chat)


def test_prompts_encoded_beside_other_answers_leave_every_answer_as_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bulk answers admitted while another decodes have their prompts encoded `PREFILL_STEP` tokens a pass beside its
    rows (model/runtime/batch_runner.py `_start_filling`), their last part folded into their own first pass: every
    answer is still the one it got alone, and the prompt chunks' rows get no logits."""
    chat = load(write_model(tmp_path / "p.gguf", "qwen2", q4_k_m, tied=False, seed=7, shape=K_SHAPE).path)
    texts = tuple(" ".join(f"word{i} number{i * j}" for j in range(12 + 5 * i)) for i in range(4))
    assert min(len(chat.prompt_ids([ChatMessage("user", text)])) for text in texts) > 2 * batch_runner.PREFILL_STEP
    passes: list[list[Feed]] = []
    recorded = batch_runner.tapped_pass

    def recording(model, cache, slots, feeds):  # type: ignore[no-untyped-def]
        passes.append(list(feeds))
        return recorded(model, cache, slots, feeds)

    monkeypatch.setattr(batch_runner, "tapped_pass", recording)
    assert_batched_answers_equal_lone_answers(chat, 12, texts)
    chunks = [feed for feeds in passes for feed in feeds if not feed.logits]
    assert chunks and all(len(feed.clean) <= batch_runner.PREFILL_STEP and not feed.noisy for feed in chunks)
    # the chunks rode in passes beside decoding rows, not in passes of their own
    assert all(any(feed.logits for feed in feeds) for feeds in passes if any(not feed.logits for feed in feeds))
