"""5- and 6-bit weights (Q5_0, Q5_1, Q5_K; Q6_K) at their own bits, PACK_FIVES and PACK_SIXES (model/runtime/
packed.py): 5 (6) bits a value in memory, and through the kernel the very bits that the same values packed a byte
each give, for every row count,
drafting (coarse) rows and thread count, with either scale kind. The AVX2 byte kernel unpacks a group in registers
for a row or two and into memory for more (quant_matmul.c's DIRECT_ROWS), so the row counts cover both."""

from __future__ import annotations

import pytest
import torch

from model.errors import ModelError
from model.runtime import quant_kernels
from model.runtime.int4_weights import available, check_rows_independent
from model.runtime.packed import GROUP, TILE, PackedLinear, PackedWeight

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


def random_weight(n: int, k: int, with_min: bool, seed: int, bits: int = 5, per: int = GROUP,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`bits`-bit values [n, k] (every value and every high bit pattern), fp16-exact scales (per `per` inputs) and
    minimums."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.int16)
    d = (torch.rand(n, k // per, generator=g) * 0.02 + 1e-3).half().float()
    m = -(torch.rand(n, k // GROUP, generator=g) * 0.1).half().float() if with_min else None
    return q, d, m


@pytest.mark.parametrize(("bits", "offset", "with_min", "scales"), [
    (5, 16, False, quant_kernels.SCALES_FP16),  # Q5_0: d (q - 16)
    (5, 0, True, quant_kernels.SCALES_FP16),  # Q5_1: d q + m
    (5, 0, True, quant_kernels.SCALES_FP32),  # Q5_K: fp32 sub-block scales and minimums
    (6, 32, False, quant_kernels.SCALES_FP32_HALVES),  # Q6_K: d (q - 32), a scale per 16 inputs
])
def test_five_and_six_bit_packings_give_the_byte_packings_bits(bits: int, offset: int, with_min: bool,
                                                                scales: int) -> None:
    n, k = 3 * TILE + 5, 4 * GROUP  # a partial tile
    halves = scales == quant_kernels.SCALES_FP32_HALVES
    q, d, m = random_weight(n, k, with_min, seed=offset + scales, bits=bits, per=GROUP // 2 if halves else GROUP)
    packed = (PackedWeight.sixes(q, d, offset) if bits == 6 else PackedWeight.fives(q, d, m, offset, scales))
    fives = PackedLinear([packed], logits=True)
    bytes_ = PackedLinear([PackedWeight.bytes(q - offset, d, m, scales)], logits=True)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(5))
    x[:, ::GROUP] *= 30.0
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (1, 2, 3, 9):
                for coarse in sorted({0, 1, rows // 2, rows}):
                    assert torch.equal(fives(x[:rows], coarse=coarse), bytes_(x[:rows], coarse=coarse)), (rows, coarse)
    finally:
        torch.set_num_threads(threads)
    w = (q - offset).float() * d.repeat_interleave(k // d.shape[1], dim=1)
    if m is not None:
        w = w + m.repeat_interleave(GROUP, dim=1)
    reference = x.double() @ w.double().t()
    error = (fives(x).double() - reference).abs().max() / reference.abs().max()
    assert error < 1e-4, error


def test_five_and_six_bit_values_take_five_and_six_bits() -> None:
    q, d, _ = random_weight(2 * TILE, 8 * GROUP, False, seed=1)
    packed = PackedWeight.fives(q, d, None, 16)
    assert packed.q.dtype == torch.uint8 and packed.q.numel() * 8 == q.numel() * 5
    assert packed.q.numel() * 8 == PackedWeight.bytes(q - 16, d, None).q.numel() * 5
    q, d, _ = random_weight(2 * TILE, 8 * GROUP, False, seed=1, bits=6, per=GROUP // 2)
    assert PackedWeight.sixes(q, d, 32).q.numel() * 8 == q.numel() * 6


def test_a_rows_result_through_five_bit_weights_does_not_depend_on_the_rows_beside_it() -> None:
    q, d, m = random_weight(96, 576, True, seed=2)
    linear = PackedLinear([PackedWeight.fives(q, d, m)])
    assert check_rows_independent(linear, linear.in_features)  # type: ignore[arg-type]


def test_values_outside_five_bits_are_refused() -> None:
    q, d, _ = random_weight(TILE, GROUP, False, seed=3)
    with pytest.raises(ModelError):
        PackedWeight.fives(q - 16, d, None, 16)
    with pytest.raises(ModelError):
        PackedWeight.sixes(q + 40, d.repeat_interleave(2, dim=1), 32)
