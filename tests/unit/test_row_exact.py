"""The runtime's own check of the row-exact kernels (model/runtime/row_exact.py), and what `dlm generate` says with
it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.cli import exactness_note
from model.runtime import row_exact


def test_the_guarantee_holds_on_this_cpus_kernels() -> None:
    assert row_exact.check_here.__wrapped__(1) is None
    assert row_exact.check_here.__wrapped__(2) is None


def test_the_check_finds_a_linear_that_rounds_a_row_by_the_rows_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def row_dependent(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, weight)
        return out + (x.shape[0] > 2) * out.abs().max() * 1e-2  # what a kernel blocked by the row count looks like

    monkeypatch.setattr(row_exact, "linear", row_dependent)
    problem = row_exact.check_here.__wrapped__(1)
    assert problem is not None and "linear 576 -> 960" in problem


def test_the_check_finds_attention_that_rounds_a_row_by_the_rows_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    exact = row_exact.attend

    def row_dependent(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        out = exact(q, *args, **kwargs)  # type: ignore[arg-type]
        return out * (1.0 + 1e-2 * (q.shape[2] > 1))

    monkeypatch.setattr(row_exact, "attend", row_dependent)
    assert row_exact.check_here.__wrapped__(1) == "bf16 attention rounds a query row by the rows beside it"


def test_a_lone_row_is_multiplied_as_one_of_two() -> None:
    weight = torch.randn(8, 4)
    x = torch.randn(1, 1, 4)
    out = row_exact.linear(x, weight)
    assert out.shape == (1, 1, 8)
    torch.testing.assert_close(out, F.linear(x, weight))


def test_dlm_generate_says_what_is_guaranteed_on_this_cpu() -> None:
    assert exactness_note(None).startswith("exact: ")
    note = exactness_note("bf16 attention rounds a query row by the rows beside it")
    assert note.startswith("not guaranteed exact on this CPU (bf16 attention") and "bf16 rounding" in note


def test_the_attention_interface_reads_a_bool_mask_as_may_attend() -> None:
    class Attention(torch.nn.Module):
        num_key_value_groups = 3

    generator = torch.Generator().manual_seed(3)
    q = torch.randn(1, 9, 5, 64, generator=generator)
    k = torch.randn(1, 3, 32, 64, generator=generator)
    v = torch.randn(1, 3, 32, 64, generator=generator)
    allowed = torch.rand(1, 1, 5, 32, generator=generator) < 0.6
    allowed[..., 0] = True
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    by_bool, _ = row_exact.attention_forward(Attention(), q, k, v, allowed, scaling=0.125, exact_rows=2)
    by_bias, _ = row_exact.attention_forward(Attention(), q, k, v, additive, scaling=0.125, exact_rows=2)
    assert torch.equal(by_bool, by_bias)
    assert by_bool.shape == (1, 5, 9, 64)
