"""Checkpoint adapters on tiny random transformers models built here (CPU, no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, ModernBertConfig, ModernBertForMaskedLM

from model.adapters.masked_lm import MaskedLMDenoiser, load_masked_lm
from model.adapters.remote_code import load_remote_code
from model.chat.spec import DecodingSettings, ModelSpec
from model.decoding.options import GenerationOptions
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig, generate
from model.errors import ModelError
from model.loading import architecture, load_chat_model, read_config
from scripts.report_lib.tiny_models import tiny_bert, tiny_remote_code

MASK, EOS = 63, 1


def sharpened(model: torch.nn.Module, std: float) -> torch.nn.Module:
    """Re-draw every weight matrix with a larger std: at the default 0.02 a random model's logits barely depend on its
    input, so the cache's approximation would be invisible and the agreement test would prove nothing."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, std)
    return model.eval()


def modernbert(seed: int, std: float = 0.2) -> MaskedLMDenoiser:
    torch.manual_seed(seed)
    config = ModernBertConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        local_attention=8,  # small sliding window, so the local layers' band matters at these lengths
        max_position_embeddings=256,
        pad_token_id=0,
        mask_token_id=MASK,
        eos_token_id=EOS,
        bos_token_id=2,
        cls_token_id=2,
        sep_token_id=EOS,
    )
    return MaskedLMDenoiser(sharpened(ModernBertForMaskedLM(config), std), MASK, frozenset({EOS}))


def bert(seed: int, std: float = 0.2) -> MaskedLMDenoiser:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
    )
    return MaskedLMDenoiser(sharpened(BertForMaskedLM(config), std), MASK, frozenset({EOS}))


@pytest.mark.parametrize("make", [modernbert, bert])
def test_cached_block_pass_matches_full_pass_while_the_canvas_is_unchanged(make) -> None:
    denoiser = make(0)
    prompt = list(range(3, 23))
    canvas = torch.full((32,), MASK)
    canvas[:8] = torch.arange(30, 38)
    denoiser.start(prompt, 32, use_cache=False)
    exact = denoiser.block_logits(canvas, 8, 16)
    denoiser.start(prompt, 32, use_cache=True)
    recorded = denoiser.block_logits(canvas, 8, 16)  # first pass of the block: full sequence, records keys/values
    cached = denoiser.block_logits(canvas, 8, 16)  # only the block runs, against the recorded keys/values
    vocab = slice(0, MASK)
    torch.testing.assert_close(recorded[:, vocab], exact[:, vocab])
    torch.testing.assert_close(cached[:, vocab], exact[:, vocab], atol=1e-5, rtol=1e-4)
    assert torch.isinf(cached[:, MASK]).all()


@pytest.mark.parametrize("make", [modernbert, bert])
def test_approximate_cache_agrees_with_uncached_decoding_within_tolerance(make) -> None:
    """The documented tolerance: on these sharpened random models, >= 60 % of answer tokens agree (measured 91 % for
    ModernBERT, 95 % for BERT over 4 seeds x 2 schedules); the first pass, which the cache runs exactly, matches."""
    agree = total = 0
    for seed in range(4):
        denoiser = make(seed)
        prompt = torch.randint(3, 60, (20,), generator=torch.Generator().manual_seed(seed)).tolist()
        for steps in (8, 4):
            cached = list(generate(denoiser, prompt, 16, SamplerConfig(8, steps, use_cache=True)))
            exact = list(generate(denoiser, prompt, 16, SamplerConfig(8, steps, use_cache=False)))
            assert (cached[0].tokens, cached[0].committed) == (exact[0].tokens, exact[0].committed)
            length = min(len(cached[-1].tokens), len(exact[-1].tokens))
            agree += sum(a == b for a, b in zip(cached[-1].tokens[:length], exact[-1].tokens[:length], strict=True))
            total += length
    assert agree / total >= 0.6


def test_masked_lm_adapter_loads_from_a_folder_and_yields_refinements(tmp_path: Path) -> None:
    tokenizer, denoiser = load_masked_lm(str(tiny_bert(tmp_path / "bert")))
    assert denoiser.mask_id == tokenizer.mask_token_id
    assert tokenizer.eos_token_id in denoiser.eos_ids
    refinements = list(generate(denoiser, tokenizer.encode("hello there"), 16, SamplerConfig(8, 4)))
    assert all(isinstance(r, Refinement) for r in refinements)
    assert refinements[-1].done and denoiser.mask_id not in refinements[-1].tokens


def test_remote_code_adapter_loads_an_auto_map_checkpoint_offline(tmp_path: Path) -> None:
    folder = tiny_remote_code(tmp_path / "llada_like")
    assert architecture(read_config(str(folder))) == "remote_code"
    tokenizer, denoiser = load_remote_code(str(folder))
    assert type(denoiser.model).__name__ == "TinyDLMModel"  # the class from the folder's own code
    assert denoiser.mask_id == tokenizer.mask_token_id
    refinements = list(generate(denoiser, tokenizer.encode("how are you"), 16, SamplerConfig(8, 2),
                                options=GenerationOptions(seed=1)))
    assert len(refinements) <= 4 and refinements[-1].done
    assert all(isinstance(r, Refinement) and denoiser.mask_id not in r.tokens for r in refinements)


def test_load_chat_model_picks_the_adapter_from_the_config(tmp_path: Path) -> None:
    model = load_chat_model(ModelSpec(str(tiny_bert(tmp_path / "bert")),
                                      decoding=DecodingSettings(block_length=4, steps_per_block=2)))
    assert type(model.backend.denoiser).__name__ == "MaskedLMDenoiser"
    assert model.sampler.block_length == 4
    remote = load_chat_model(ModelSpec(str(tiny_remote_code(tmp_path / "remote"))))
    assert type(remote.backend.denoiser).__name__ == "RemoteCodeDenoiser"


def test_unknown_path_is_a_clear_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        load_chat_model(ModelSpec(str(tmp_path / "missing")))
    with pytest.raises(ModelError, match="not found"):
        load_chat_model(ModelSpec(str(tmp_path)))  # a folder, but no config.json


def test_checkpoint_without_mask_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no mask token"):
        load_chat_model(ModelSpec(str(tiny_bert(tmp_path / "bert", with_mask=False))))


def test_causal_lm_checkpoint_has_no_masked_adapter(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ModelError, match="no diffusion adapter"):
        load_chat_model(ModelSpec(str(tmp_path)))


def test_a_spec_refuses_what_no_model_can_do() -> None:
    with pytest.raises(ModelError, match="unknown weights"):
        ModelSpec(weights="int3")
    with pytest.raises(ModelError, match="max_batch must be at least 1"):
        ModelSpec(max_batch=0)
    with pytest.raises(ModelError, match="unknown device"):
        ModelSpec(device="tpu")


def test_a_block_length_other_than_the_adapters_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import model.bundled.default_model as default_model

    def no_base(*args: object, **kwargs: object) -> None:
        raise AssertionError("the base model must not be loaded for a request that is refused anyway")

    monkeypatch.setattr(default_model, "load_base", no_base)
    (tmp_path / "adapter.json").write_text(json.dumps({"adapter": {"block_length": 4}, "sampler": {}}))
    with pytest.raises(ModelError, match=r"block length 8 does not match .* trained with blocks of 4 tokens"):
        load_chat_model(ModelSpec(str(tmp_path), decoding=DecodingSettings(block_length=8, steps_per_block=8)))


def test_a_tiny_masked_model_knows_its_context(tmp_path: Path) -> None:
    model = load_chat_model(ModelSpec(str(tiny_bert(tmp_path / "bert")),
                                      decoding=DecodingSettings(block_length=8, steps_per_block=8)))
    assert model.context_length == 256  # the tiny BERT's max_position_embeddings
