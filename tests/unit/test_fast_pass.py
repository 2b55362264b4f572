"""The fused inference pass (model/runtime/fast_pass.py) computes what the block-diffusion model's modules compute."""

from __future__ import annotations

import torch

from model.bundled.block_diffusion import BlockDiffusionLM
from model.runtime.batching import KEY_MULTIPLE, Feed, SlotCache, additive_mask, pass_layout, prefill
from model.runtime.fast_pass import FastPass
from model.runtime.row_exact import attend
from tests.unit.test_self_speculative import adapted, bf16_adapted, one_thread  # noqa: F401  (autouse: 1 thread)

FEEDS = (
    Feed(clean=(3, 4, 5), noisy=(0, 0, 0, 0), after=(1, 1, 3, 3)),  # blocks after drafts
    Feed(clean=(6,), noisy=(0, 0)),  # fewer noisy rows: padding between its clean and noisy rows
    Feed(clean=(7, 8)),  # clean only
)


PROMPTS = ([5, 7, 9, 11, 3, 4, 20, 30, 31], [5, 7, 9, 2, 1], [9, 8, 7, 6, 5, 4, 3])


def one_pass(model: BlockDiffusionLM, runner, answers: int = 3) -> torch.Tensor:
    """Logits of one pass over `answers` sequences with different cached lengths (batched: 3), through `runner`.
    A pass of one answer attends its clean rows one by one (model/runtime/row_exact.py), a batched one together."""
    cache = SlotCache(answers)
    with torch.inference_mode():
        for slot, tokens in enumerate(PROMPTS[:answers]):
            prefill(model, cache, slot, tokens)
        feeds = [Feed(f.clean, (model.mask_id,) * len(f.noisy), f.after) for f in FEEDS[:answers]]
        lengths = [len(slot.ids) for slot in cache.slots]
        ids, positions, noisy, allowed = pass_layout(lengths, feeds, KEY_MULTIPLE)
        cache.bind(list(range(answers)), lengths)
        return runner(ids, positions, additive_mask(allowed), noisy, cache)


def test_the_fused_pass_gives_the_modules_logits_bit_for_bit() -> None:
    for model in (adapted(seed=2), bf16_adapted(seed=2)):
        fused = model.inference_pass()
        assert isinstance(fused, FastPass)
        for answers in (1, 3):
            assert torch.equal(one_pass(model, fused, answers), one_pass(model, model, answers)), answers


def test_the_modules_weights_are_views_of_the_fused_ones() -> None:
    model = adapted()
    fused = model.inference_pass()
    attention = model.base.model.layers[0].self_attn
    storage = fused.layers[0].qkv.untyped_storage().data_ptr()
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert projection.base.weight.untyped_storage().data_ptr() == storage
    assert not any(p.is_inference() for p in model.parameters())  # training can still use the modules


def test_a_new_adapter_rebuilds_the_fused_pass() -> None:
    model = adapted()
    before = one_pass(model, model.inference_pass())
    state = {name: tensor * 2 for name, tensor in model.adapter_state().items()}
    model.load_adapter_state(state)
    after = one_pass(model, model.inference_pass())
    assert torch.equal(after, one_pass(model, model))
    assert not torch.equal(after, before)  # the noisy rows see the new LoRA


def test_training_uses_the_modules() -> None:
    model = adapted()
    model.train()
    assert model.inference_pass() is model


def test_in_bf16_a_query_rows_attention_does_not_depend_on_the_rows_beside_it() -> None:
    # SmolLM2's attention shape: 9 query heads of 64 over 3 key heads. Attended together, a row's output depended on
    # how many rows shared the SDPA call (25 of these cases with a lone row over repeated keys; on MKL's AVX2 kernels
    # and oneDNN without AMX also with the group layout), enough to flip bf16 near-ties between an autoregressive
    # step and a self-speculative pass. The exact rows (a pass's clean ones) must come out as if each were alone.
    generator = torch.Generator().manual_seed(0)
    differ = []
    for keys_length in range(32, 1056, 32):  # key lengths as a SlotCache returns them: multiples of KEY_MULTIPLE
        for _ in range(8):
            visible = int(torch.randint(1, keys_length - 16, (1,), generator=generator))
            exact = int(torch.randint(1, 8, (1,), generator=generator))  # clean rows; the rest are mask rows
            q = torch.randn(1, 9, 8, 64, generator=generator).bfloat16()
            k = torch.randn(1, 3, keys_length, 64, generator=generator).bfloat16()
            v = torch.randn(1, 3, keys_length, 64, generator=generator).bfloat16()
            allowed = torch.zeros(1, 1, 8, keys_length, dtype=torch.bool)
            allowed[..., :visible] = True
            for row in range(1, 8):  # the other rows see a few more keys (drafts after the first row)
                allowed[0, 0, row, visible : visible + row] = True
            bias = additive_mask(allowed).bfloat16()
            among = attend(q, k, v, bias, 0.125, exact_rows=exact)
            for row in range(exact):
                alone = attend(q[:, :, row : row + 1], k, v, bias[:, :, row : row + 1], 0.125, exact_rows=1)
                if not torch.equal(alone[0, 0], among[0, row]):
                    differ.append((keys_length, visible, exact, row))
    assert differ == []


def test_mask_rows_attended_together_match_the_exact_layout_closely() -> None:
    """The rows after `exact_rows` take the cheaper grouped layout: the same attention up to bf16 rounding."""
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 9, 12, 64, generator=generator).bfloat16()
    k = torch.randn(2, 3, 96, 64, generator=generator).bfloat16()
    v = torch.randn(2, 3, 96, 64, generator=generator).bfloat16()
    allowed = torch.rand(2, 1, 12, 96, generator=generator) < 0.7
    allowed[..., 0] = True
    bias = additive_mask(allowed).bfloat16()
    exact = attend(q, k, v, bias, 0.125, exact_rows=12)
    mixed = attend(q, k, v, bias, 0.125, exact_rows=4)
    assert torch.equal(exact[:, :4], mixed[:, :4])
    assert torch.allclose(exact.float(), mixed.float(), atol=2e-2)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(3, 1), v.float().repeat_interleave(3, 1), attn_mask=bias.float(),
        scale=0.125,
    )
    assert torch.allclose(exact.float(), reference.transpose(1, 2), atol=2e-2)


def test_a_rows_pass_reads_the_embedding_and_the_rotary_tables_as_the_modules_compute_them() -> None:
    model = bf16_adapted(seed=2)
    fused = model.inference_pass()
    assert fused._embedding_bits is not None  # the bf16 table: widened in numpy
    ids = torch.tensor([3, model.mask_id, model.vocab_size - 1, 0, model.mask_id])
    assert torch.equal(fused._embedded(ids), model.embed(ids[None]).float()[0])
    for positions in ([0], [7, 200, 1023], [5000, 3, 1024]):  # past the table's first 1,024 rows: it grows
        cos, sin = fused._rotary_rows(torch.tensor(positions))
        expected = [t[0] for t in fused._rotary_fp32(torch.tensor([positions]))]
        assert torch.equal(torch.from_numpy(cos), expected[0]) and torch.equal(torch.from_numpy(sin), expected[1])
