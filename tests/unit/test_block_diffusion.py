"""The block-diffusion form of a causal LM, on a tiny random Llama built here (no files, no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model.bundled.backend import BlockDiffusionBackend
from model.bundled.block_diffusion import (
    AdapterConfig,
    BlockDiffusionLM,
    load_adapter,
    save_adapter,
)
from model.chat.engine import DiffusionChatModel
from model.decoding.options import GenerationOptions
from model.decoding.sampler import SamplerConfig
from model.errors import ModelError
from model.runtime.batching import SlotCache, additive_mask
from model.training.block_training import batch_logits, block_diffusion_loss, make_batch
from scripts.report_lib.passes import answer_refinements, stop_batching
from scripts.report_lib.tiny_models import LLAMA_EOS, LLAMA_VOCAB, tiny_llama
from tests.unit.drive import BlockAnswer, uncached_block_logits

VOCAB = LLAMA_VOCAB
EOS = LLAMA_EOS


def adapted(seed: int = 0, block: int = 4) -> BlockDiffusionLM:
    model = BlockDiffusionLM(tiny_llama(seed), AdapterConfig(block_length=block, lora_rank=4))
    with torch.no_grad():  # a non-trivial adapter, so gating and caching mistakes show up
        for name, parameter in model.named_parameters():
            if "lora_b" in name:
                parameter.normal_(0, 0.2)
    return model.eval()


PROMPT = [5, 9, 11, 3, 7, 20]


def test_cached_and_uncached_passes_agree_block_by_block() -> None:
    model = adapted()
    canvas = torch.full((12,), model.mask_id)
    canvas[:6] = torch.tensor([10, 12, 14, 16, 18, 21])
    answer = BlockAnswer(model, PROMPT)
    per_block = []
    for lo in range(0, 12, 4):
        per_block.append(answer.block_logits(canvas, lo, lo + 4))
        per_block.append(answer.block_logits(canvas, lo, lo + 4))  # a second pass of the same block
        answer.finish_block(canvas, lo, lo + 4)
    uncached = [uncached_block_logits(model, PROMPT, canvas, lo, lo + 4) for lo in (0, 0, 4, 4, 8, 8)]
    outputs = {True: torch.stack(per_block), False: torch.stack(uncached)}
    assert outputs[True].shape == (6, 4, VOCAB + 1)
    torch.testing.assert_close(outputs[True], outputs[False], atol=1e-4, rtol=1e-4)


def test_first_position_of_each_block_is_the_teachers_next_token_prediction() -> None:
    model = adapted()
    teacher = model.base
    answer = [10, 12, 14, 16, 18, 21, 22, 23]
    canvas = torch.tensor(answer)
    passes = BlockAnswer(model, PROMPT)
    passes.block_logits(canvas, 0, 4)
    passes.finish_block(canvas, 0, 4)
    second_block = passes.block_logits(canvas, 4, 8)
    with torch.no_grad(), AdapterOff(model):
        ar = teacher(torch.tensor([PROMPT + answer[:4]])).logits[0, -1]
    torch.testing.assert_close(second_block[0, :VOCAB], ar, atol=1e-4, rtol=1e-4)


def test_prefill_in_padded_chunks_is_exact_and_uses_few_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    import model.bundled.block_diffusion as block_diffusion
    import model.runtime.batching as batching

    model = adapted()
    shapes: set[tuple[int, ...]] = set()
    runner = model.inference_pass()

    def recording(input_ids: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        shapes.add(tuple(input_ids.shape))
        return runner(input_ids, *args, **kwargs)

    monkeypatch.setattr(batching, "PREFILL_CHUNK", 40)  # so that long prompts take several chunks
    canvas = torch.full((8,), model.mask_id)
    canvas[:4] = torch.tensor([10, 12, 14, 16])
    for length in (1, 6, 33, 40, 41, 95):
        prompt = [(5 + 7 * i) % (VOCAB - 3) + 3 for i in range(length)]
        # the reference: the whole sequence in one unpadded forward
        expected = [uncached_block_logits(model, prompt, canvas, lo, lo + 4) for lo in (0, 4)]
        monkeypatch.setattr(model, "inference_pass", lambda: recording)
        answer = BlockAnswer(model, prompt)
        first = answer.block_logits(canvas, 0, 4)
        answer.finish_block(canvas, 0, 4)
        second = answer.block_logits(canvas, 4, 8)  # attends to the cached prompt: padding must be gone
        monkeypatch.setattr(model, "inference_pass", lambda: runner)
        torch.testing.assert_close(torch.stack([first, second]), torch.stack(expected), atol=1e-4, rtol=1e-4)
    # chunks of 40 tokens are padded to 48: prefills (of all but the prompt's last token) ran at two lengths (32,
    # 48), block passes at two (the prompt's last token + 4; the finished block + 4)
    assert shapes == {(1, 32), (1, 48), (1, 5), (1, 8)}
    assert [block_diffusion.prefill_bucket(n) for n in (1, 32, 33, 49, 65, 97, 129, 1000)] == [
        32, 32, 48, 64, 96, 128, 192, 1024,
    ]


def test_the_next_prompt_reuses_the_cached_conversation_exactly() -> None:
    model = adapted()
    cache = SlotCache(1)  # kept from one answer to the next
    canvas = torch.tensor([10, 12, 14, 16, 18, 21, 22, 23])
    warm = BlockAnswer(model, PROMPT, cache)
    for lo in (0, 4):
        warm.block_logits(canvas, lo, lo + 4)
        warm.finish_block(canvas, lo, lo + 4)
    # the cache now holds the prompt and the first block (the second was never fused into a later pass)
    follow_ups = {
        "the conversation goes on": (PROMPT + canvas.tolist() + [30, 31, 5], len(PROMPT) + 4),
        "the same prompt again": (PROMPT, len(PROMPT) - 1),  # one token is always encoded, for the logits
        "a different start": ([7, *PROMPT[1:]], 0),
    }
    next_canvas = torch.full((8,), model.mask_id)
    next_canvas[:3] = torch.tensor([40, 41, 42])
    for case, (prompt, reused) in follow_ups.items():
        warm = BlockAnswer(model, prompt, cache)
        assert warm.reused_tokens == reused, case
        got = warm.block_logits(next_canvas, 0, 4)
        fresh = BlockAnswer(model, prompt)
        torch.testing.assert_close(got, fresh.block_logits(next_canvas, 0, 4), atol=1e-4, rtol=1e-4, msg=case)
        warm.finish_block(next_canvas, 0, 4)
        warm.block_logits(next_canvas, 4, 8)  # leaves more answer tokens in the cache for the next case
    warm = BlockAnswer(model, PROMPT, cache, reuse=False)
    assert warm.reused_tokens == 0


class AdapterOff:
    """Zero the LoRA factors temporarily: what the base model alone computes."""

    def __init__(self, model: BlockDiffusionLM) -> None:
        self.model = model
        self.saved: dict[str, torch.Tensor] = {}

    def __enter__(self) -> None:
        for name, parameter in self.model.named_parameters():
            if "lora_b" in name:
                self.saved[name] = parameter.detach().clone()
                parameter.data.zero_()

    def __exit__(self, *exc: object) -> None:
        params = dict(self.model.named_parameters())
        for name, value in self.saved.items():
            params[name].data.copy_(value)


def test_mask_never_predicted_and_blocks_must_run_in_order() -> None:
    model = adapted()
    canvas = torch.full((8,), model.mask_id)
    answer = BlockAnswer(model, PROMPT)
    logits = answer.block_logits(canvas, 0, 4)
    assert torch.isneginf(logits[:, model.mask_id]).all()
    with pytest.raises(ModelError, match="in order"):
        answer.block_logits(canvas, 4, 8)  # block 0 never finished
    with pytest.raises(ModelError, match="empty"):
        BlockAnswer(model, [])


def test_a_diffusion_answer_is_the_same_with_and_without_the_cache() -> None:
    model = adapted(seed=3)
    results = []
    for use_cache in (True, False):
        config = SamplerConfig(block_length=4, steps_per_block=4, threshold=0.5, use_cache=use_cache)
        chat = DiffusionChatModel("tiny", None, BlockDiffusionBackend(model, [EOS]), config)
        refinements = list(answer_refinements(chat, PROMPT, 16, config, GenerationOptions(seed=0)))
        stop_batching(chat)
        assert refinements[-1].done
        results.append(refinements[-1].tokens)
    assert results[0] == results[1]


def test_training_batch_attention_and_targets() -> None:
    generator = torch.Generator().manual_seed(0)
    examples = [(PROMPT, [10, 11, 12, 13, 14, EOS]), (PROMPT[:3], [20, 21, EOS])]
    block, copies, mask_id = 4, 2, VOCAB
    batch = make_batch(examples, block, mask_id, EOS, copies, generator)
    kn = batch.noisy_ids.shape[1]
    n = kn // copies
    t = batch.clean_ids.shape[1]
    allowed = batch.noisy_bias[:, 0] == 0  # [b, K*n, T + K*n]
    for row, (prompt, answer) in enumerate(examples):
        padded = answer + [EOS] * (-len(answer) % block)  # the answer region, EOS-filled to whole blocks
        assert batch.clean_ids[row, : len(prompt) + len(padded)].tolist() == prompt + padded
        for q in range(kn):
            copy, j = divmod(q, n)
            assert batch.noisy_pos[row, q] == len(prompt) + j, "noisy positions must continue the prompt"
            block_start = len(prompt) + (j // block) * block
            keys = set(allowed[row, q].nonzero().flatten().tolist())
            if j < len(padded):
                # exactly: the clean prompt and answer before its block, and its own block in its own copy
                own_block = {t + copy * n + k for k in range(len(padded)) if k // block == j // block}
                assert keys == set(range(block_start)) | own_block, (row, q)
                token = int(batch.noisy_ids[row, q])
                assert token in (mask_id, padded[j])  # the input is the answer, some positions masked
            else:  # padding past this row's answer: itself (and clean keys), and no loss
                assert keys == set(range(block_start)) | {t + q}, (row, q)
            # position j predicts the NEXT token j + 1, inside its block, wherever that token is masked in the input
            supervised = j + 1 < len(padded) and (j + 1) % block != 0 and int(batch.noisy_ids[row, q + 1]) == mask_id
            assert int(batch.targets[row, q]) == (padded[j + 1] if supervised else -100), (row, q)
        for copy in range(copies):  # every block of every copy carries loss somewhere
            for lo in range(0, len(padded), block):
                assert (batch.targets[row, copy * n + lo : copy * n + lo + block] != -100).any()


def test_the_adapter_is_on_at_noisy_positions_and_off_at_clean_ones() -> None:
    model = adapted()
    ids = torch.tensor([[*PROMPT, 10, 12, model.mask_id, 14]])
    s, p = ids.shape[1], len(PROMPT)
    q = torch.arange(s)
    causal = additive_mask(q[:, None] >= q[None, :])[None, None]  # one attention pattern: only the gate differs
    noisy = (q >= p)[None]
    with torch.no_grad():
        gated = model(ids, q[None], causal, noisy, None)[0]
        all_noisy = model(ids, q[None], causal, torch.ones_like(noisy), None)[0]
        with AdapterOff(model):
            base = model(ids, q[None], causal, noisy, None)[0]
    torch.testing.assert_close(gated[:p], base[:p], atol=1e-5, rtol=1e-5)  # clean rows: exactly the base model
    assert (all_noisy[:p] - base[:p]).abs().amax() > 1e-2  # ...which is the gate's doing: the adapter is not trivial
    assert (gated[p:] - base[p:]).abs().amax(dim=-1).min() > 1e-2  # every noisy row: the adapter is on


def test_a_training_batch_and_a_decoding_pass_give_the_same_logits_for_the_same_canvas() -> None:
    model = adapted()
    answer = [10, 11, 12, 13, 14, 15, 16, EOS]  # two blocks of 4
    batch = make_batch([(PROMPT, answer)], 4, model.mask_id, EOS, 1, torch.Generator().manual_seed(3))
    with torch.no_grad():
        training = batch_logits(model, batch)[0]  # [8, VOCAB]: row i predicts answer position i + 1
    noisy = batch.noisy_ids[0]
    assert (noisy == model.mask_id).any()
    passes = BlockAnswer(model, PROMPT)
    for lo in (0, 4):
        canvas = torch.full((8,), model.mask_id)
        canvas[:lo] = torch.tensor(answer[:lo])  # finished blocks hold the answer, as the clean pass does
        canvas[lo : lo + 4] = noisy[lo : lo + 4]  # the active block exactly as the training copy masked it
        decoded = passes.block_logits(canvas, lo, lo + 4)  # row j predicts answer position lo + j
        torch.testing.assert_close(decoded[1:, :VOCAB], training[lo : lo + 3], atol=1e-4, rtol=1e-4)
        canvas[lo : lo + 4] = torch.tensor(answer[lo : lo + 4])
        passes.finish_block(canvas, lo, lo + 4)


def test_training_step_updates_only_the_adapter_and_reduces_loss() -> None:
    model = BlockDiffusionLM(tiny_llama(1), AdapterConfig(block_length=4, lora_rank=4))
    model.train()
    examples = [(PROMPT, [10, 11, 12, 13, 14, 15, EOS]), (PROMPT[1:], [20, 21, 22, EOS])]
    optimizer = torch.optim.AdamW(list(model.trainable_parameters()), lr=1e-2)
    frozen_before = model.base.model.embed_tokens.weight.detach().clone()
    losses = []
    for step in range(30):
        batch = make_batch(examples, 4, model.mask_id, EOS, 2, torch.Generator().manual_seed(step % 3))
        loss, stats = block_diffusion_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(stats["loss"])
    assert torch.equal(model.base.model.embed_tokens.weight, frozen_before)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5


def test_adapter_round_trip(tmp_path: Path) -> None:
    model = adapted(seed=2)
    save_adapter(model, tmp_path, extra={"sampler": {"threshold": 0.9}})
    restored = load_adapter(tiny_llama(2), tmp_path)
    canvas = torch.full((4,), model.mask_id)
    outs = []
    for m in (model, restored):
        outs.append(BlockAnswer(m, PROMPT).block_logits(canvas, 0, 4))
    torch.testing.assert_close(outs[0], outs[1], atol=2e-2, rtol=1e-2)  # fp16 storage of the LoRA factors
    with pytest.raises(ModelError, match="no block-diffusion adapter"):
        load_adapter(tiny_llama(2), tmp_path / "missing")
