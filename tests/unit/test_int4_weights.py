"""Int4 weights from Q4_1 blocks (model/runtime/int4_weights.py): the shipped file read exactly, the kernel's rows
independent, and self-speculative decoding still bit for bit equal to autoregressive decoding on them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from model.bundled.block_diffusion import GatedLoRALinear
from model.gguf.blocks import raw_blocks
from model.gguf.header import read_header
from model.gguf.int4_file import cached_int4_weights, read_gguf_head, read_gguf_linears, read_q4_1
from model.process.threads import torch_threads
from model.runtime import quant_kernels
from model.runtime.batching import Feed, SlotCache, batched_pass, prefill
from model.runtime.fast_pass import PassPath
from model.runtime.int4_weights import (
    GROUP,
    LAYOUT,
    Int4Layer,
    Int4Linear,
    Int4Weights,
    Q4Blocks,
    Q8Head,
    available,
    check_rows_independent,
    quantize_q4_1,
)
from tests.unit.test_self_speculative import assert_modes_agree, bf16_adapted, rows_whose_logits_differ


def quantize_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round a float weight `[N, K]` to Q8_0 as llama.cpp does (per group of 32: `d = max |w| / 127` in fp16)."""
    n, k = weight.shape
    groups = weight.detach().float().view(n, k // GROUP, GROUP)
    d = (groups.abs().amax(-1) / 127).half().float()
    safe = torch.where(d == 0, torch.ones_like(d), d)
    q = torch.round(groups / safe[..., None]).clamp(-127, 127).to(torch.int8)
    return q.view(n, k), d


def int4_weights_of(causal_lm: Any) -> Int4Weights:
    """Int4 weights rounded from a tiny Llama's own (`quantize_q4_1`, `quantize_q8_0` for the head; an adapted
    linear's base weight): what a GGUF would give it."""
    layers = []
    for layer in causal_lm.model.layers:
        modules = {**{n: getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")},
                   **{n: getattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj")}}
        linears = {n: m.base if isinstance(m, GatedLoRALinear) else m for n, m in modules.items()}
        layers.append(Int4Layer.from_blocks({n: quantize_q4_1(linear.weight) for n, linear in linears.items()}))
    head = Q8Head.from_q8_0(*quantize_q8_0(causal_lm.get_output_embeddings().weight))
    return Int4Weights(layers, head)

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


def test_q4_1_blocks_read_as_gguf_dequantizes_them() -> None:
    import gguf

    from model.bundled.default_model import base_gguf_path

    header = read_header(base_gguf_path())
    raw = raw_blocks(header, header.tensor("blk.3.ffn_down.weight"))
    expected = gguf.quants.dequantize(np.asarray(raw), gguf.GGMLQuantizationType.Q4_1)  # gguf-py's own arithmetic
    assert torch.equal(read_q4_1(header, header.tensor("blk.3.ffn_down.weight")).dequantize(),
                       torch.from_numpy(expected).float())


@pytest.mark.slow
def test_the_gguf_blocks_are_the_bundled_models_weights_in_hf_row_order() -> None:
    """Every linear of every layer, q and k un-permuted: the blocks de-quantize to the converted checkpoint's
    weights exactly, so the int4 teacher is the same network as the bf16 one, with its weights unrounded."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from model.bundled.default_model import base_gguf_path, ensure_base_checkpoint

    folder = ensure_base_checkpoint()
    config = AutoConfig.from_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    layers = read_gguf_linears(base_gguf_path(), config)
    assert len(layers) == config.num_hidden_layers
    head = read_gguf_head(base_gguf_path())
    assert head is not None
    q, d = head
    embedding = state.get("lm_head.weight", state["model.embed_tokens.weight"])
    assert torch.equal((q.float().view(q.shape[0], -1, GROUP) * d[..., None]).view(q.shape), embedding)
    for index, weights in enumerate(layers):
        for name, blocks in weights.items():
            group = "self_attn" if name[0] in "qkvo" else "mlp"
            assert torch.equal(blocks.dequantize(), state[f"model.layers.{index}.{group}.{name}.weight"]), (index, name)


def test_the_kernel_computes_the_q4_1_weights_about_as_closely_as_a_bf16_copy() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 128, generator=generator) * 0.1
    weight[:, :GROUP] += 2.0  # a group far from zero: its zero point is large
    blocks = quantize_q4_1(weight)
    exact = blocks.dequantize()
    assert (exact - weight).abs().max() <= blocks.d.max() / 2 + 1e-3  # the rounding to 4 bits itself
    through_kernel = Int4Linear.from_blocks(blocks)(torch.eye(128, dtype=torch.bfloat16)).t().float()
    zero = (blocks.m + 8 * blocks.d).abs().repeat_interleave(GROUP, dim=1)
    step = blocks.d.repeat_interleave(GROUP, dim=1)
    # the zero and the scale rounded to bf16 (half an ulp: 2^-8 relative), then the output (another 2^-8): as close
    # to the file's weights as a bf16 copy of them is, give or take a factor of two
    error = (through_kernel - exact).abs()
    assert (error <= (zero + 8 * step + exact.abs()) * 2**-8 + 1e-6).all()
    assert error.mean() <= 2 * (exact.bfloat16().float() - exact).abs().mean()


def test_the_q8_0_head_as_two_int4_halves_computes_the_files_head() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 96, generator=generator)
    q, d = quantize_q8_0(weight)
    exact = (q.float().view(64, 3, GROUP) * d[..., None]).view(64, 96)
    assert (exact - weight).abs().max() <= d.max() / 2 + 1e-6
    through_kernel = Q8Head.from_q8_0(q, d)(torch.eye(96, dtype=torch.bfloat16)).t()
    # only d rounded to bf16 (2^-8 relative), each half's output to bf16 (2^-8 of each half)
    half_bound = (16 * 8 + 16) * d.repeat_interleave(GROUP, dim=1) * 2**-8
    assert ((through_kernel - exact).abs() <= exact.abs() * 2**-8 + half_bound).all()
    assert (through_kernel - exact).abs().mean() <= 2 * (exact.bfloat16().float() - exact).abs().mean()


def test_the_kernels_round_activations_far_finer_than_8_bits() -> None:
    """Activations with one large value per group of 32, as a layer's inputs have: the kernels' products equal the
    fp32 products of the file's weights to ~1e-4 of the output's scale, 30x closer than bf16 copies of both (3e-3).
    Rounded to 8 bits alone (llama.cpp's activations) they were off by 2e-2, the rounding that cost the int4
    teacher its answers' quality."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=generator)
    x[:, ::GROUP] *= 40.0  # an outlier in every group: the small values then sit a few 8-bit steps from zero
    weight = torch.randn(48, 256, generator=generator) * 0.1
    blocks, (q, d) = quantize_q4_1(weight), quantize_q8_0(weight)
    for kernel, exact in (
        (Int4Linear.from_blocks(blocks), blocks.dequantize()),
        (Q8Head.from_q8_0(q, d), (q.float().view(48, -1, GROUP) * d[..., None]).view(48, 256)),
    ):
        reference = x.double() @ exact.double().t()
        error = (kernel(x).double() - reference).abs().max() / reference.abs().max()
        assert error < 3e-4, error


def test_quantize_q4_1_keeps_a_constant_group_exact() -> None:
    weight = torch.full((16, GROUP), 0.25)
    assert torch.equal(quantize_q4_1(weight).dequantize(), weight)


@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (576, 576), (3072, 576), (576, 1536)])
def test_a_rows_int4_output_does_not_depend_on_the_rows_beside_it(out_features: int, in_features: int) -> None:
    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(out_features)) * 0.05
    assert check_rows_independent(Int4Linear.from_blocks(quantize_q4_1(weight)), in_features)


def test_passes_of_many_rows_and_of_none_go_through_the_kernels() -> None:
    """Rows past the kernels' chunk of 64 are computed as the others; no rows give an empty output."""
    weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(1)) * 0.05
    linear, head = Int4Linear.from_blocks(quantize_q4_1(weight)), Q8Head.from_q8_0(*quantize_q8_0(weight))
    x = torch.randn(150, 64, generator=torch.Generator().manual_seed(2))
    for kernel in (linear, head):
        together = kernel(x)
        assert torch.equal(together[130:], kernel(x[130:])) and torch.equal(together[:3], kernel(x[:3]))
        assert kernel(x[:0]).shape == (0, 96)


def test_blocks_stack_along_the_output() -> None:
    a, b = quantize_q4_1(torch.randn(8, 64)), quantize_q4_1(torch.randn(4, 64))
    assert torch.equal(Q4Blocks.stack([a, b]).dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def int4_model(seed: int = 0):
    model = bf16_adapted(seed)
    model.use_int4(int4_weights_of(model.base))
    return model


def test_decoding_passes_and_prefills_of_any_length_use_the_int4_weights() -> None:
    """With int4 weights every prefill goes through the decode kernel, long or short (a prompt token's keys are then
    the same bits however much of its prompt was cached): a prompt encoded in two parts gives the next pass the
    logits it gets from the prompt encoded whole."""
    model = bf16_adapted()
    long = [3 + i % 37 for i in range(72)]

    def run(tokens: list[int], split: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        cache = SlotCache(1)
        if split is not None:
            prefill(model, cache, 0, tokens[:split])
        _, prompt_logits = prefill(model, cache, 0, tokens[:-1])
        feed = Feed(clean=(tokens[-1],), noisy=(model.mask_id,) * 3)
        [(clean, _)] = batched_pass(model, cache, [0], [feed])
        return prompt_logits, clean[0]

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return not torch.equal(a, b) and float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.95

    dense_prompt, dense_step = run(long)
    model.use_int4(int4_weights_of(model.base))
    assert model.inference_pass().native is not None  # the decode kernel takes this model
    int4_prompt, int4_step = run(long)
    assert close(int4_prompt, dense_prompt) and close(int4_step, dense_step)
    assert torch.equal(run(long, split=50)[1], int4_step)
    model.use_int4(None)
    assert torch.equal(run(long)[1], dense_step)


def drafting_pass_logits(model) -> torch.Tensor:
    """The logits `[7, V]` of a pass of 4 clean rows and 3 masks after a prefill of 33 tokens (fp32)."""
    tokens = list(range(3, 40))
    cache = SlotCache(1)
    prefill(model, cache, 0, tokens[:-4])
    [(clean, noisy)] = batched_pass(model, cache, [0], [Feed(clean=tuple(tokens[-4:]), noisy=(model.mask_id,) * 3)])
    return torch.cat([clean, noisy]).float()


def test_with_int4_weights_a_pass_of_one_answer_runs_in_the_decode_kernel() -> None:
    assert int4_model().inference_pass().native is not None


def test_the_decode_kernel_computes_the_layers_of_the_torch_pass() -> None:
    """The C layer (fp32 residual, bf16 cache) against the torch pass on the same int4 kernels in fp32: equal up to
    the cache's bf16 rounding (and the 8-bit activations' roundings it moves), with and without the LoRA's noisy
    rows. A layer computed wrong (no rotary, no LoRA, a wrong head order) falls far below these bounds."""
    model = int4_model()
    native = drafting_pass_logits(model)
    model.base.float()
    model.use_int4(model.int4)  # an fp32 model: the torch pass, on the same int4 kernels in fp32
    assert model.inference_pass().native is None
    reference = drafting_pass_logits(model)
    assert torch.nn.functional.cosine_similarity(native, reference, dim=-1).min() > 0.995
    assert (native.argmax(-1) == reference.argmax(-1)).float().mean() > 0.8


@pytest.mark.parametrize("cpu", sorted(quant_kernels.TARGETS))
def test_other_cpus_builds_of_the_kernels_compute_the_same_bits(cpu: str, monkeypatch) -> None:
    """The kernels' arithmetic is explicit (exact integer sums, fused multiply-adds, a fixed lane tree), so the
    AVX-512 VNNI, AVX-512 and AVX2 builds give a pass the same logits."""
    if not quant_kernels.runs_here(cpu):
        pytest.skip(f"this CPU cannot run the {cpu} build ({', '.join(quant_kernels.TARGET_FLAGS[cpu])})")
    model = int4_model()
    here = drafting_pass_logits(model)
    other = quant_kernels.build(quant_kernels.TARGETS[cpu])
    monkeypatch.setattr(quant_kernels, "_load", lambda: (other, None))
    assert quant_kernels.library() is other
    assert torch.equal(drafting_pass_logits(model), here)


def test_with_int4_weights_a_tokens_logits_do_not_depend_on_the_rows_sharing_its_pass() -> None:
    assert rows_whose_logits_differ(int4_model(), range(5, 120, 7)) == []


@pytest.mark.slow
def test_with_int4_weights_self_speculative_answers_equal_autoregressive_ones_bit_for_bit() -> None:
    model = int4_model()
    with torch.no_grad():  # large logits: near-ties are common, as in SmolLM2's 49k vocabulary
        model.base.model.norm.weight.mul_(60.0)
    model.use_int4(model.int4)  # the fused pass reads the new norm
    assert_modes_agree(model, prompts_count=8)


def test_the_weights_choice_is_checked_before_loading() -> None:
    from model.bundled.default_model import _int4_wanted
    from model.chat.spec import ModelSpec
    from model.errors import ModelError

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert _int4_wanted("auto", cpu) and _int4_wanted("int4", cpu)
    assert not _int4_wanted("bf16", cpu)
    assert not _int4_wanted("auto", cuda)  # the int4 kernels are CPU ones: a GPU keeps bf16
    with pytest.raises(ModelError, match="CPU ones"):
        _int4_wanted("int4", cuda)
    with pytest.raises(ModelError, match="unknown weights"):
        ModelSpec(weights="int8")


def test_int4_weights_are_refused_for_a_checkpoint_without_the_bundled_gguf(tmp_path) -> None:
    from model.chat.spec import ModelSpec
    from model.errors import ModelError
    from model.loading import load_chat_model
    from scripts.report_lib.tiny_models import tiny_bert

    with pytest.raises(ModelError, match="bundled model's GGUF"):
        load_chat_model(ModelSpec(str(tiny_bert(tmp_path / "bert")), weights="int4"))


def test_the_packed_cache_loads_the_same_weights_and_is_rebuilt_for_another_file(tmp_path) -> None:
    from transformers import AutoConfig

    from model.bundled.default_model import base_gguf_path, ensure_base_checkpoint

    config = AutoConfig.from_pretrained(ensure_base_checkpoint())
    cache_file = tmp_path / "int4.safetensors"
    built = cached_int4_weights(base_gguf_path(), config, cache_file)
    written = cache_file.stat().st_mtime_ns
    loaded = cached_int4_weights(base_gguf_path(), config, cache_file)
    assert cache_file.stat().st_mtime_ns == written  # read, not rebuilt
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(0)).bfloat16()
    assert torch.equal(built.layers[7].gate_up(x), loaded.layers[7].gate_up(x))
    assert built.head is not None and loaded.head is not None and torch.equal(built.head(x), loaded.head(x))
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(cache_file), "pt") as handle:
        stale = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
        metadata = {**handle.metadata(), "layout": "an older one"}
    save_file(stale, str(cache_file), metadata=metadata)  # as if an older version had packed it
    cached_int4_weights(base_gguf_path(), config, cache_file)
    with safe_open(str(cache_file), "pt") as handle:
        assert handle.metadata()["layout"] == LAYOUT


def test_the_probe_passes_here_and_catches_a_kernel_that_rounds_by_the_rows(monkeypatch) -> None:
    from model.runtime import int4_weights

    assert int4_weights.check_here.__wrapped__(1) is None
    kernel = Int4Linear.__call__

    def by_rows(self: Int4Linear, x: torch.Tensor) -> torch.Tensor:
        out = kernel(self, x)
        return out + (x.reshape(-1, x.shape[-1]).shape[0] > 3) * 2**-6  # rounds differently past 3 rows

    monkeypatch.setattr(Int4Linear, "__call__", by_rows)
    assert "rounds a row by the rows beside it" in int4_weights.check_here.__wrapped__(1)


def test_answers_in_one_pass_get_the_logits_each_gets_alone_bit_for_bit() -> None:
    """Several answers' rows in one decode-kernel pass (each attending its own slot, clean rows of all answers first,
    drafting rows last): every answer's clean and noisy logits are those of its pass alone, and nothing of a pass of
    several answers falls back to torch."""
    model = int4_model()
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 512, (n,), generator=generator).tolist() for n in (9, 40, 23)]
    mask = model.mask_id
    feeds = [
        Feed(clean=(5,), noisy=(mask,) * 3, drafts=True),  # a drafting pass: coarse mask rows
        Feed(clean=(6, 7, 8)),  # an autoregressive or verifying one
        Feed(clean=(9, 10), noisy=(11, mask, mask, mask)),  # a diffusion block: its noisy rows decide
    ]

    def cache_with(slots: list[int]) -> SlotCache:
        cache = SlotCache(3)
        for slot in slots:
            prefill(model, cache, slot, prompts[slot])
        return cache

    alone = [batched_pass(model, cache_with([i]), [i], [feeds[i]])[0] for i in range(3)]
    together = batched_pass(model, cache_with([0, 1, 2]), [0, 1, 2], feeds)
    for (clean, noisy), (clean_alone, noisy_alone) in zip(together, alone, strict=True):
        assert torch.equal(clean, clean_alone) and torch.equal(noisy, noisy_alone)
    assert together[1][0].shape[0] == 3 and together[2][1].shape[0] == 4


def test_drafting_rows_are_coarse_and_close_to_fine_ones() -> None:
    """A drafting pass's mask rows skip the activations' remainder: their logits differ from the same rows computed
    fine but stay close to them (they only propose drafts), and the clean rows are the same bits either way."""
    model = int4_model()
    tokens = list(range(3, 40))

    def pass_logits(drafts: bool) -> tuple[torch.Tensor, torch.Tensor]:
        cache = SlotCache(1)
        prefill(model, cache, 0, tokens[:-4])
        feed = Feed(clean=tuple(tokens[-4:]), noisy=(model.mask_id,) * 3, drafts=drafts)
        [(clean, noisy)] = batched_pass(model, cache, [0], [feed])
        return clean, noisy

    (fine_clean, fine_noisy), (coarse_clean, coarse_noisy) = pass_logits(False), pass_logits(True)
    assert torch.equal(fine_clean, coarse_clean)
    assert not torch.equal(fine_noisy, coarse_noisy)
    assert torch.nn.functional.cosine_similarity(fine_noisy, coarse_noisy, dim=-1).min() > 0.99


def test_coarse_rows_of_the_kernels_are_the_eight_bit_rounding_alone() -> None:
    """Rows from `coarse` on are computed from each group's 8-bit rounding alone (llama.cpp's), the rows before it
    from the rounding and its remainder; each row's result is the same whichever rows share the call."""
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(48, 256, generator=generator) * 0.1
    q, d = quantize_q8_0(weight)
    head = Q8Head.from_q8_0(q, d)
    x = torch.randn(4, 256, generator=generator)
    fine, coarse = head(x), head(x, coarse=2)
    assert torch.equal(fine[:2], coarse[:2]) and torch.equal(head(x[2:], coarse=0), coarse[2:])
    groups = x.view(4, -1, GROUP)
    step = groups.abs().amax(-1, keepdim=True) / 127
    rounded = (torch.round(groups / step) * step).view(4, 256)  # the 8-bit part alone
    exact = (q.float().view(48, -1, GROUP) * d[..., None]).view(48, 256)
    reference = rounded[2:].double() @ exact.double().t()
    assert (coarse[2:].double() - reference).abs().max() / reference.abs().max() < 1e-5
    assert (fine[2:].double() - reference).abs().max() / reference.abs().max() > 1e-4


def test_one_place_chooses_how_a_pass_runs_and_a_model_the_kernel_refuses_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = int4_model()
    fast = model.inference_pass()
    assert fast.native_refusal is None
    assert fast.path(1, 4, prefill=False) is PassPath.NATIVE and fast.path(1, 40, prefill=True) is PassPath.NATIVE
    assert fast.path(2, 4, prefill=False) is PassPath.INT4  # several answers in torch's loop while that is cheaper
    assert fast.path(4, 4, prefill=False) is PassPath.DENSE and fast.path(2, 40, prefill=True) is PassPath.DENSE
    model.base.float()
    with caplog.at_level(logging.WARNING, logger="model.runtime.fast_pass"):
        model.use_int4(model.int4)  # fp32 weights: the kernel is written for bf16
        refused = model.inference_pass()
    assert refused.native_refusal == "torch.float32 weights, not bf16" and refused.path(1, 4, False) is PassPath.INT4
    assert "decode kernel does not take this model (torch.float32 weights, not bf16)" in caplog.text
