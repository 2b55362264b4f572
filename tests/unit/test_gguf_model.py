"""A user's GGUF model loaded and answering: tiny llama, qwen2 and qwen3 files written by the tests, in every
supported tensor type, loaded with exactly the weights the file holds (gguf-py's de-quantization), decoded
autoregressively through the bundled model's back end to the network's own greedy answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_answers import answer, assert_batched_answers_equal_lone_answers

from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.chat.spec import ModelSpec
from model.loading import load_chat_model
from scripts.report_lib.tiny_gguf import K_SHAPE, TinyModel, ollama_layout, write_model

T = GGMLQuantizationType


def load(source: str) -> DiffusionChatModel:
    chat = load_chat_model(ModelSpec(source=source, precision="fp32"))
    assert isinstance(chat, DiffusionChatModel)
    return chat


def assert_weights_are_the_files(chat: DiffusionChatModel, model: TinyModel) -> None:
    state = chat.backend.model.base.state_dict()  # type: ignore[attr-defined]
    assert set(model.weights) <= set(state)
    for name, expected in model.weights.items():
        assert np.array_equal(state[name].numpy(), expected), name
    # a tied head is the embedding matrix itself
    if "lm_head.weight" not in model.weights:
        assert np.array_equal(state["lm_head.weight"].numpy(), model.weights["model.embed_tokens.weight"])


def greedy(chat: DiffusionChatModel, prompt: list[int], length: int) -> list[int]:
    """The network's own greedy answer, a full forward a token (no cache, transformers' SDPA)."""
    base = chat.backend.model.base  # type: ignore[attr-defined]
    ends = chat.backend.eos_ids  # type: ignore[attr-defined]
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(length):
            logits = base(torch.tensor([tokens])).logits[0, -1]
            tokens.append(int(logits.argmax()))
            if tokens[-1] in ends:
                break
    return tokens[len(prompt):]


@pytest.mark.parametrize(("architecture", "qtype", "tied"), [
    ("llama", T.Q8_0, True), ("qwen2", T.Q4_0, False), ("qwen3", T.Q5_0, True),
])
def test_each_architecture_loads_the_files_weights_and_answers_greedily(
    tmp_path: Path, architecture: str, qtype: T, tied: bool
) -> None:
    model = write_model(tmp_path / f"{architecture}.gguf", architecture, qtype, tied, seed=3)
    chat = load(str(model.path))
    assert_weights_are_the_files(chat, model)
    assert chat.sampler.decoding == "autoregressive"
    assert chat.note is not None and "decodes autoregressively (no draft adapter" in chat.note
    prompt, tokens = answer(chat, "hello the world", 12)
    assert len(tokens) >= 1
    assert tokens == greedy(chat, prompt, 12)
    # the template's end of a message is the end-of-turn probe's token and ends answers
    assert chat.tokenizer.eos_token == "<|im_end|>"
    assert chat.message_tail()[0] == chat.tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_q4_1_q5_1_f16_and_bf16_tensors_load_as_the_file_holds_them(tmp_path: Path) -> None:
    kinds = {"attn_q": T.Q4_1, "attn_k": T.Q5_1, "attn_v": T.F16, "attn_output": T.BF16}
    model = write_model(tmp_path / "mixed.gguf", "qwen2",
                        lambda name: next((kind for part, kind in kinds.items() if f".{part}." in name), T.F32))
    assert_weights_are_the_files(load(str(model.path)), model)


def test_k_quant_blocks_mixed_as_a_q4_k_m_file_mixes_them_load_as_gguf_py_reads_them(tmp_path: Path) -> None:
    def q4_k_m(name: str) -> T:
        if "token_embd" in name:
            return T.Q8_0
        return T.Q6_K if "ffn_down" in name or name == "output.weight" else T.Q5_K if "attn_v" in name else T.Q4_K

    model = write_model(tmp_path / "k.gguf", "llama", q4_k_m, tied=False, shape=K_SHAPE)
    chat = load(str(model.path))
    assert_weights_are_the_files(chat, model)
    assert "(Q4_K x10, F32 x5, Q6_K x3, Q5_K x2, Q8_0 x1)" in (chat.note or "")


def test_rope_frequency_factors_and_linear_scaling_divide_the_rotary_frequencies(tmp_path: Path) -> None:
    model = write_model(tmp_path / "rope.gguf", "llama", T.F32, rope_factors=True, linear_rope=2.0)
    chat = load(str(model.path))
    head_dim = 16
    plain = 1.0 / 10000.0 ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    expected = plain / (2.0 * model.rope_factors.astype(np.float64))  # type: ignore[union-attr]
    inv_freq = chat.backend.model.base.model.rotary_emb.inv_freq.numpy()  # type: ignore[attr-defined]
    np.testing.assert_allclose(inv_freq, expected, rtol=1e-6)
    prompt, tokens = answer(chat, "the", 6)
    assert tokens == greedy(chat, prompt, 6)  # the runtime's passes rotate as the network's own forward does


def test_a_model_named_through_ollama_loads_under_its_ollama_name(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_model(tmp_path / "tiny.gguf", "qwen3", T.Q8_0)
    store = tmp_path / "ollama"
    ollama_layout(store, model.path, name="tiny-qwen", tag="q8")
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    chat = load("ollama:tiny-qwen:q8")
    assert chat.name == "tiny-qwen:q8"
    assert_weights_are_the_files(chat, model)
    prompt, tokens = answer(chat, "he the", 4)
    assert tokens == greedy(chat, prompt, 4)


def test_concurrent_answers_share_passes_and_equal_their_lone_answers(tmp_path: Path) -> None:
    """fp32: an answer batched with others is the answer it gets alone (the qwen2 biases ride along per row)."""
    chat = load(str(write_model(tmp_path / "b.gguf", "qwen2", T.Q8_0, tied=False, seed=5).path))
    assert_batched_answers_equal_lone_answers(chat)
    assert chat.max_batch == 8


def test_the_next_prompt_encoded_ahead_is_reused_by_the_next_turn(tmp_path: Path) -> None:
    chat = load(str(write_model(tmp_path / "c.gguf", "qwen3", T.Q8_0, seed=7).path))
    history = [ChatMessage("user", "hello"), ChatMessage("assistant", "the world")]
    ahead = chat.next_prompt_prefix(history)  # what a voice session encodes while idle: history, next user header
    list(chat.backend.runner.prepare(ahead, owner="talk"))  # type: ignore[attr-defined]  # waits until encoded
    options = GenerationOptions(max_new_tokens=6, conversation="talk")
    prompt = chat.prompt_ids([*history, ChatMessage("user", "he the")])
    drafts = list(chat.stream_prompt(prompt, options))
    assert drafts[-1].cached_prompt_tokens == len(ahead) and prompt[: len(ahead)] == ahead
    reference = greedy(chat, prompt, 6)
    last = drafts[-1]
    assert last.refinement is not None
    assert list(last.refinement.tokens[: last.completion_tokens]) == reference[: last.completion_tokens]


def test_a_sentencepiece_vocabulary_gets_its_bos_and_its_templates_end_of_message(tmp_path: Path) -> None:
    """TinyLlama's kind: `tokenizer.ggml.model` "llama", BOS added to every prompt (its Zephyr template writes none),
    and the template ends a message with EOS."""
    model = write_model(tmp_path / "spm.gguf", "llama", T.Q4_0, tokenizer="llama", seed=11)
    chat = load(str(model.path))
    prompt, tokens = answer(chat, "hello the world", 8)
    assert prompt[0] == chat.tokenizer.bos_token_id == 1
    assert prompt.count(1) == 1
    assert chat.tokenizer.eos_token == "</s>" and chat.message_tail()[0] == 2
    assert tokens == greedy(chat, prompt, 8)


def test_the_templates_end_of_message_ends_answers_when_the_files_eos_is_another_token(tmp_path: Path) -> None:
    """Llama 3's kind: EOS `<|end_of_text|>` while the template ends a message with `<|eot_id|>` (here `<|im_end|>`):
    both end an answer, and the end-of-turn probe reads the template's."""
    model = write_model(tmp_path / "eot.gguf", "llama", T.Q8_0, eos="<|endoftext|>", seed=2)
    chat = load(str(model.path))
    ids = chat.tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    assert chat.backend.eos_ids == frozenset(ids)  # type: ignore[attr-defined]
    assert chat.tokenizer.eos_token == "<|im_end|>" and chat.message_tail()[0] == ids[1]


@pytest.mark.parametrize("tokenizer", ["gpt2", "llama"])
def test_the_tokenizer_and_config_come_back_from_the_cache_as_transformers_built_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer: str
) -> None:
    from model.gguf.header import read_header
    from model.gguf.text_config import CACHE_FOLDER, tokenizer_and_config

    monkeypatch.setenv("VOICE_ASSISTANT_CACHE", str(tmp_path / "cache"))
    model = write_model(tmp_path / "tiny.gguf", tokenizer=tokenizer)
    built_tokenizer, built_config = tokenizer_and_config(read_header(model.path))
    entries = list((tmp_path / "cache" / CACHE_FOLDER).iterdir())
    assert len(entries) == 1  # one entry, no partial folder beside it
    copy = tmp_path / "elsewhere" / "blob"  # as an Ollama store keeps the same file under another name
    copy.parent.mkdir()
    copy.write_bytes(model.path.read_bytes())
    cached_tokenizer, cached_config = tokenizer_and_config(read_header(copy))
    assert cached_tokenizer.name_or_path == str(entries[0])  # read from the entry, not built again
    assert list((tmp_path / "cache" / CACHE_FOLDER).iterdir()) == entries
    text = "hello the world, hello"
    messages = [{"role": "user", "content": text}]
    assert cached_tokenizer(text).input_ids == built_tokenizer(text).input_ids
    assert cached_tokenizer.apply_chat_template(messages) == built_tokenizer.apply_chat_template(messages)
    assert (cached_tokenizer.bos_token, cached_tokenizer.eos_token) == (built_tokenizer.bos_token,
                                                                        built_tokenizer.eos_token)
    assert {**cached_config.to_dict(), "_name_or_path": ""} == {**built_config.to_dict(), "_name_or_path": ""}
