"""scripts/device_check.py's measurements on a tiny block-diffusion Llama, on cpu and (where torch sees one) cuda:
every shape and mode the JSON promises, with figures that are real timings of the serving code."""

from __future__ import annotations

import pytest
import torch

from model.device import resolve_device
from model.runtime.batching import SlotCache
from scripts.device_check import (
    BATCHES,
    DECODING_BATCHES,
    MODES,
    ROWS,
    Budget,
    Subject,
    copy_slot,
    decoding_runs,
    pass_costs,
    random_model,
)
from tests.unit.test_device import DEVICES
from tests.unit.test_self_speculative import adapted, one_thread  # noqa: F401  (autouse: tiny tensors, 1 thread)

TINY = Budget(cache_length=12, warmup=0, repeats=1, new_tokens=4)


@pytest.mark.parametrize("device", DEVICES)
def test_pass_costs_cover_every_rows_and_batch_shape(device: str) -> None:
    model = adapted().to(device)
    costs = pass_costs(model, resolve_device(device), TINY)
    assert list(costs) == [f"rows={rows}" for rows in ROWS]
    for by_batch in costs.values():
        assert list(by_batch) == [f"batch={batch}" for batch in BATCHES]
        assert all(ms > 0 for ms in by_batch.values())


@pytest.mark.parametrize("device", DEVICES)
def test_decoding_runs_every_mode_at_each_batch_size_to_the_full_length(device: str) -> None:
    model = adapted().to(device)
    # an end-of-answer id the model never emits: every answer runs to its full length, so the count is exact
    subject = Subject(model, frozenset({model.vocab_size + 7}), list(range(5, 18)), "random")
    results = decoding_runs(subject, TINY)
    assert list(results) == list(MODES)
    for mode, runs in results.items():
        for answers in DECODING_BATCHES:
            run = runs[f"batch={answers}"]
            assert run["answers"] == answers
            assert run["tokens"] == answers * TINY.new_tokens, mode
            assert run["tokens_per_s"] > 0 and 0 < run["first_draft_ms_median"] <= run["seconds"] * 1e3
    assert results["autoregressive"]["batch=1"]["batched_passes"] == TINY.new_tokens  # one token a pass


def test_copy_slot_gives_the_target_the_sources_cache() -> None:
    from model.runtime.batching import prefill

    model = adapted()
    cache = SlotCache(3)
    prefill(model, cache, 0, [5, 6, 7, 8])
    prefill(model, cache, 2, [9, 10])
    copy_slot(cache, 0, 2)
    assert cache.slots[2].ids == [5, 6, 7, 8]
    for keys, values in zip(cache._keys, cache._values, strict=True):
        assert torch.equal(keys[2], keys[0]) and torch.equal(values[2], values[0])


def test_the_random_stand_in_has_smollm2_135ms_shape_and_the_bundled_adapters_config() -> None:
    model = random_model(torch.device("meta"))
    config = model.base.config
    shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
             config.head_dim, config.intermediate_size, config.vocab_size, config.tie_word_embeddings)
    assert shape == (576, 30, 9, 3, 64, 1536, 49152, True)
    assert model.config.block_length == 4 and model.config.lora_rank == 16
    assert model.base.dtype == torch.bfloat16 and next(model.trainable_parameters()).dtype == torch.float32
    frozen = sum(p.numel() for p in model.base.parameters() if not p.requires_grad)  # the base, without the LoRA
    assert frozen == pytest.approx(134.5e6, rel=0.01)
