"""5- and 6-bit weights (Q5_0, Q5_1, Q5_K; Q6_K) at their own bits, PACK_FIVES and PACK_SIXES (model/runtime/
packed.py): 5 (6) bits a value in memory, and through the kernel the very bits that the same values packed a byte
each give, for every row count, drafting (coarse) rows and thread count, with either kind of scales (the file's fp16
per group, or a K-quant's super-block scales and sub-block integers). The AVX2 byte kernel unpacks a group in
registers for a row or two and into memory for more (quant_matmul.c's DIRECT_ROWS), so the row counts cover both."""

from __future__ import annotations

import pytest
import torch
from kernel_sweep import rows_and_coarse

from model.errors import ModelError
from model.runtime.int4_weights import available, check_rows_independent
from model.runtime.packed import GROUP, SUPER, TILE, PackedLinear, PackedWeight, SubScales

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


def random_weight(n: int, k: int, with_min: bool, seed: int, bits: int = 5, per: int = GROUP,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`bits`-bit values [n, k] (every value and every high bit pattern), fp16-exact scales (per `per` inputs) and
    minimums."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.int16)
    d = (torch.rand(n, k // per, generator=g) * 0.02 + 1e-3).half().float()
    m = -(torch.rand(n, k // per, generator=g) * 0.1).half().float() if with_min else None
    return q, d, m


def random_sub_scales(n: int, k: int, halves: bool, seed: int) -> SubScales:
    """A K-quant's sub-block integers: 6-bit scales and minimums per 32 inputs (Q5_K), or int8 scales per 16 (Q6_K)."""
    g = torch.Generator().manual_seed(seed)
    if halves:
        return SubScales(torch.randint(-128, 128, (n, k // 16), generator=g, dtype=torch.int16), None)
    return SubScales(*(torch.randint(0, 64, (n, k // GROUP), generator=g, dtype=torch.int16) for _ in range(2)))


@pytest.mark.parametrize(("bits", "offset", "with_min", "k_quant"), [
    (5, 16, False, False),  # Q5_0: d (q - 16)
    (5, 0, True, False),  # Q5_1: d q + m
    (5, 0, True, True),  # Q5_K: super-blocks' d and m times the sub-blocks' 6-bit integers
    (6, 32, False, True),  # Q6_K: d (q - 32), a d times an int8 per 16 inputs
])
def test_five_and_six_bit_packings_give_the_byte_packings_bits(bits: int, offset: int, with_min: bool,
                                                                k_quant: bool) -> None:
    n, k = 3 * TILE + 5, 2 * SUPER  # a partial tile, two super-blocks
    q, d, m = random_weight(n, k, with_min, seed=offset + bits, bits=bits, per=SUPER if k_quant else GROUP)
    sub = random_sub_scales(n, k, bits == 6, seed=bits) if k_quant else None
    if bits == 6:
        assert sub is not None
        packed = PackedWeight.sixes(q, d, sub, offset)
    else:
        packed = PackedWeight.fives(q, d, m, offset, sub)
    fives = PackedLinear([packed], logits=True)
    bytes_ = PackedLinear([PackedWeight.bytes(q - offset, d, m, sub)], logits=True)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(5))
    x[:, ::GROUP] *= 30.0
    for rows, coarse in rows_and_coarse():
        assert torch.equal(fives(x[:rows], coarse=coarse), bytes_(x[:rows], coarse=coarse)), (rows, coarse)
    if sub is not None:  # a sub-block's scale (minimum) is its super-block's times its integer
        d = d.repeat_interleave(sub.scale.shape[1] // d.shape[1], dim=1) * sub.scale.float()
        if m is not None and sub.min is not None:
            m = m.repeat_interleave(SUPER // GROUP, dim=1) * sub.min.float()
    w = (q - offset).float() * d.repeat_interleave(k // d.shape[1], dim=1)
    if m is not None:
        w = w + m.repeat_interleave(GROUP, dim=1)
    reference = x.double() @ w.double().t()
    error = (fives(x).double() - reference).abs().max() / reference.abs().max()
    # K-quants' rows are all from hi alone (quant_matmul.c): each activation off by up to 1/254 of its group's
    # largest, here 30x the others; the remainder takes that to 1/64516
    assert error < (0.03 if k_quant else 1e-4), error


def test_five_and_six_bit_values_take_five_and_six_bits() -> None:
    q, d, _ = random_weight(2 * TILE, 8 * GROUP, False, seed=1)
    packed = PackedWeight.fives(q, d, None, 16)
    assert packed.q.dtype == torch.uint8 and packed.q.numel() * 8 == q.numel() * 5
    assert packed.q.numel() * 8 == PackedWeight.bytes(q - 16, d, None).q.numel() * 5
    q, d, _ = random_weight(2 * TILE, SUPER, False, seed=1, bits=6, per=SUPER)
    assert PackedWeight.sixes(q, d, random_sub_scales(2 * TILE, SUPER, True, seed=1), 32).q.numel() * 8 == q.numel() * 6


def test_a_rows_result_through_five_bit_weights_does_not_depend_on_the_rows_beside_it() -> None:
    q, d, m = random_weight(96, 576, True, seed=2)
    linear = PackedLinear([PackedWeight.fives(q, d, m)])
    assert check_rows_independent(linear, linear.in_features)  # type: ignore[arg-type]


def test_values_outside_five_bits_are_refused() -> None:
    q, d, _ = random_weight(TILE, GROUP, False, seed=3)
    with pytest.raises(ModelError):
        PackedWeight.fives(q - 16, d, None, 16)
    q, d, _ = random_weight(TILE, SUPER, False, seed=3, bits=6, per=SUPER)
    sub = random_sub_scales(TILE, SUPER, True, seed=3)
    with pytest.raises(ModelError):
        PackedWeight.sixes(q + 40, d, sub, 32)
    with pytest.raises(ModelError):  # a K-quant's scales come per super-block of 256 inputs
        PackedWeight.sixes(q, d.repeat_interleave(2, dim=1), sub, 32)
