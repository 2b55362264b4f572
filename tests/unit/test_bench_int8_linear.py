"""The int8 linear benchmark's claims (model card, "Int8 linear layers, tried"): a fixed activation scale keeps each
row's output independent of the rest of the pass, torch's dynamic int8 linear does not, and both stay close to fp32."""

from __future__ import annotations

import torch

from scripts.bench.bench_int8_linear import Bf16, Int8Dynamic, Int8FixedScale


def _weight_and_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """The bundled model's q/k/v shape (960 x 576): for a toy 96 x 64 the oneDNN kernels chosen for 1 and 16 rows
    dequantize in a different order (1 ulp apart), so the claim is checked where it is made, on the model's shapes."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(960, 576, generator=generator) / 24
    rows = torch.randn(16, 576, generator=generator)
    rows[5:] *= 3.0  # other rows with a larger range move a shared activation scale
    return weight, rows


def test_a_fixed_activation_scale_leaves_each_row_alone() -> None:
    weight, rows = _weight_and_rows()
    together = Int8FixedScale(weight, 12.0 / 127, rows=16)(rows)
    alone = Int8FixedScale(weight, 12.0 / 127, rows=1)(rows[:1])
    assert torch.equal(together[:1], alone)
    assert torch.equal(Bf16(weight)(rows)[:1], Bf16(weight)(rows[:1]))


def test_the_dynamic_int8_linear_lets_other_rows_change_a_row() -> None:
    weight, rows = _weight_and_rows()
    dynamic = Int8Dynamic(weight)
    assert not torch.equal(dynamic(rows)[:1], dynamic(rows[:1]))


def test_both_int8_linears_stay_near_fp32() -> None:
    weight, rows = _weight_and_rows()
    reference = rows @ weight.T
    for out in (Int8Dynamic(weight)(rows), Int8FixedScale(weight, 12.0 / 127, rows=16)(rows)):
        assert float((out - reference).abs().max() / reference.abs().max()) < 0.1
