"""First run on a fresh machine: the packaged GGUF of the base model becomes a safetensors cache, exactly.

The conversion (the file's tensors de-quantized by our header walk and gguf-py) runs into an empty cache folder, as on a
machine that has never seen the model, and the converted model must compute the same logits as transformers' own
GGUF loading of the packaged file, an independent reading of it.
"""

from __future__ import annotations

import pytest
import torch

from model.bundled.default_model import BASE_NAME, base_gguf_path, cache_root, ensure_base_checkpoint

pytestmark = pytest.mark.slow


def test_the_packaged_gguf_converts_into_an_empty_cache_with_the_same_logits(tmp_path, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("VOICE_ASSISTANT_CACHE", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache" and not cache_root().exists()
    folder = ensure_base_checkpoint()
    assert folder == tmp_path / "cache" / BASE_NAME
    assert not list((tmp_path / "cache").glob("*.partial"))  # no partial folder left behind
    written = (folder / "model.safetensors").stat().st_mtime_ns
    assert ensure_base_checkpoint() == folder  # a second start reuses the cache ...
    assert (folder / "model.safetensors").stat().st_mtime_ns == written  # ... without converting again

    gguf = base_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)  # transformers' own, built from the file's metadata

    text = "What is the capital of France? The capital of France is"
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.shape[1] >= 8
    with torch.no_grad():
        expected = reference(ids).logits
        actual = converted(ids).logits
    assert torch.allclose(actual, expected, atol=1e-4, rtol=1e-4), (actual - expected).abs().max()
    assert converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()  # still tied
    assert tokenizer.decode(int(actual[0, -1].argmax())).strip()  # a real next word, not padding
    state, expected_state = converted.state_dict(), reference.state_dict()
    assert set(state) == set(expected_state)
    assert all(torch.equal(state[name], expected_state[name]) for name in state)  # every weight, exactly
