"""DiffusionGemma driven through its own generate on a tiny random config built here."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaTextConfig

from model.adapters.diffusion_gemma import diffusion_gemma_chat_model, diffusion_gemma_refinements
from model.chat import ChatMessage, GenerationOptions
from model.decoding.grammar import GrammarError, response_format
from model.errors import ModelError
from scripts.report_lib.tiny_models import word_tokenizer

CANVAS, EOS = 8, 5


@pytest.fixture(scope="module")
def tiny_gemma() -> DiffusionGemmaForBlockDiffusion:
    torch.manual_seed(0)
    text = DiffusionGemmaTextConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=16,
        max_position_embeddings=256,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        num_experts=2,
        top_k_experts=1,
        moe_intermediate_size=32,
        eos_token_id=EOS,
        pad_token_id=0,
        bos_token_id=2,
    )
    vision = {"model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 16}
    config = DiffusionGemmaConfig(
        text_config=text, vision_config=vision, canvas_length=CANVAS, boi_token_id=37, eoi_token_id=38,
        image_token_id=39,
    )
    return DiffusionGemmaForBlockDiffusion(config).eval()


def test_each_denoising_step_is_a_refinement_and_blocks_commit_when_accepted(tiny_gemma) -> None:
    refinements = list(
        diffusion_gemma_refinements(tiny_gemma, [2, 7, 8, 9], 16, frozenset({EOS}), seed=0, max_denoising_steps=3)
    )
    drafts, last = refinements[:-1], refinements[-1]
    assert 2 <= len(drafts) <= 6  # at most 3 steps per canvas, two canvases unless the first ends in EOS
    assert all(not r.done and len(r.tokens) % CANVAS == 0 for r in drafts)
    assert not any(drafts[0].committed) and drafts[0].block == 0
    second_block = [r for r in drafts if r.block == 1]
    assert all(r.committed[:CANVAS] == (True,) * CANVAS for r in second_block)
    if second_block:  # the accepted first canvas is what the second block's drafts show as committed
        assert second_block[0].tokens[:CANVAS] == last.tokens[:CANVAS]
    assert last.done and last.finish_reason in ("stop", "length") and all(last.committed)
    assert [r.step for r in refinements] == list(range(len(refinements)))


def test_same_seed_same_answer_and_cancel_stops(tiny_gemma) -> None:
    def answer(seed: int):
        return list(diffusion_gemma_refinements(tiny_gemma, [2, 7], 16, frozenset({EOS}), seed=seed))[-1].tokens

    assert answer(3) == answer(3)
    cancel = threading.Event()
    stream = diffusion_gemma_refinements(tiny_gemma, [2, 7], 64, frozenset({EOS}), cancel, seed=0)
    next(stream)
    cancel.set()
    rest = list(stream)
    assert rest[-1].done and rest[-1].finish_reason == "cancelled"  # how many drafts were queued first is timing
    already = threading.Event()
    already.set()  # cancelled before the first pass: the worker stops at its first draft, on any machine
    stopped = list(diffusion_gemma_refinements(tiny_gemma, [2, 7], 64, frozenset({EOS}), already, seed=0))
    assert [(r.done, r.finish_reason) for r in stopped] == [(False, None), (True, "cancelled")]


def test_chat_model_streams_drafts(tiny_gemma) -> None:
    tokenizer = word_tokenizer()
    model = diffusion_gemma_chat_model("tiny-gemma", tokenizer, tiny_gemma, max_denoising_steps=2)
    drafts = list(model.stream_chat([ChatMessage("user", "hello")], GenerationOptions(max_new_tokens=5, seed=1)))
    assert drafts[-1].done and len(drafts[-1].refinement.tokens) <= CANVAS  # 5 rounds up to one canvas
    assert all(not piece.committed for piece in drafts[0].pieces)


def test_its_own_sampler_refuses_a_response_format(tiny_gemma) -> None:
    """Its generate knows no grammar: a response format is refused, and a voice session offers it no tools."""
    model = diffusion_gemma_chat_model("tiny-gemma", word_tokenizer(), tiny_gemma, max_denoising_steps=2)
    assert not model.constrains_answers
    options = GenerationOptions(max_new_tokens=5, response_format=response_format("json_object"))
    with pytest.raises(GrammarError, match="own sampler"):
        list(model.stream_chat([ChatMessage("user", "hello")], options))


def test_empty_prompt_is_refused(tiny_gemma) -> None:
    with pytest.raises(ModelError, match="empty"):
        list(diffusion_gemma_refinements(tiny_gemma, [], 8, frozenset({EOS})))


class Boom(Exception):
    """Not one of the exception types the worker used to forward (RuntimeError, ValueError, IndexError)."""


@pytest.mark.timeout(60)
def test_any_failure_of_generate_reaches_the_consumer_and_ends_the_stream(tiny_gemma, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise Boom("out of something")

    monkeypatch.setattr(tiny_gemma, "generate", broken)
    with pytest.raises(Boom, match="out of something"):
        list(diffusion_gemma_refinements(tiny_gemma, [2, 7], 8, frozenset({EOS})))

    def silent(*args, **kwargs):  # returns without a single draft and without ending its streamer
        return None

    monkeypatch.setattr(tiny_gemma, "generate", silent)
    refinements = list(diffusion_gemma_refinements(tiny_gemma, [2, 7], 8, frozenset({EOS})))
    assert [(r.done, r.finish_reason, r.tokens) for r in refinements] == [(True, "length", ())]


def test_a_block_length_other_than_the_canvas_is_refused(tiny_gemma, tmp_path) -> None:
    from model.adapters.diffusion_gemma import load_diffusion_gemma
    from model.chat.spec import DecodingSettings, ModelSpec

    tiny_gemma.config.save_pretrained(tmp_path)  # the check reads only the config: no weights are loaded
    with pytest.raises(ModelError, match=rf"block length 4 does not match .*\(canvas_length\) are {CANVAS} tokens"):
        load_diffusion_gemma(str(tmp_path), torch.device("cpu"), ModelSpec(decoding=DecodingSettings(block_length=4)))
