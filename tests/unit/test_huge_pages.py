"""The packed weights on 2 MB pages (model/runtime/huge_pages.py): the same values in one aligned arena, in the
order given, the kernels' results unchanged, and huge pages under them wherever the kernel lends them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from model.runtime.huge_pages import ALIGN, HUGE_PAGE, Arena, onto_huge_pages
from model.runtime.int4_weights import Int4Linear, Q8Head, available, quantize_q4_1
from tests.unit.test_int4_weights import int4_weights_of, quantize_q8_0
from tests.unit.test_self_speculative import bf16_adapted

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_lent() -> bool:
    """Linux with transparent huge pages for a mapping that asks (`[always]` or `[madvise]`)."""
    return sys.platform == "linux" and THP.is_file() and "[never]" not in THP.read_text()


def anon_huge_kb(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span.group(1), 16) <= address < int(span.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_the_arena_starts_on_a_huge_page_and_each_tensor_on_a_cache_line() -> None:
    arena = Arena(1000)
    a = arena.place(torch.arange(10, dtype=torch.int8))
    b = arena.place(torch.tensor([1.5, -2.0], dtype=torch.float16).view(2, 1))
    assert a.data_ptr() % HUGE_PAGE == 0 and b.data_ptr() == a.data_ptr() + ALIGN
    assert a.tolist() == list(range(10)) and b.dtype == torch.float16 and b.flatten().tolist() == [1.5, -2.0]
    with pytest.raises(ValueError, match="holds"):
        arena.place(torch.zeros(1000, dtype=torch.uint8))


@pytest.mark.skipif(available() is not None, reason=str(available()))
def test_moved_linears_compute_the_same_bits_from_the_arena() -> None:
    torch.manual_seed(0)
    linear = Int4Linear.from_blocks(quantize_q4_1(torch.randn(80, 96)))
    head = Q8Head.from_q8_0(*quantize_q8_0(torch.randn(48, 64)))
    x, y = torch.randn(3, 96), torch.randn(2, 64)
    before = linear(x), head(y), head(y, coarse=1)
    arena = onto_huge_pages([linear, head])
    assert arena is not None
    start, end = arena.memory.data_ptr(), arena.memory.data_ptr() + arena.memory.numel()
    pointers = [t.data_ptr() for t in linear.tensors() + head.tensors()]
    assert pointers == sorted(pointers) and all(start <= p < end for p in pointers)  # the order given, inside
    assert [s.q for s in linear.structs[:1]] == [linear.nibbles.data_ptr()]  # the kernel's view follows them
    after = linear(x), head(y), head(y, coarse=1)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.skipif(available() is not None, reason=str(available()))
def test_a_models_int4_weights_go_onto_one_arena_in_pass_order() -> None:
    model = bf16_adapted()
    weights = int4_weights_of(model.base)
    model.use_int4(weights)
    layer = weights.layers[0]
    order = [layer.qkv, layer.o, layer.gate_up, layer.down, weights.layers[1].qkv]
    firsts = [linear.tensors()[0].data_ptr() for linear in order]
    assert firsts[0] % HUGE_PAGE == 0 and firsts == sorted(firsts)
    assert weights.head is not None and weights.head.tensors()[0].data_ptr() > firsts[-1]  # the head read last


@pytest.mark.skipif(not huge_pages_lent(), reason="no transparent huge pages here")
def test_the_arena_is_backed_by_huge_pages() -> None:
    arena = Arena(4 * HUGE_PAGE)
    arena.place(torch.ones(4 * HUGE_PAGE, dtype=torch.uint8))
    assert anon_huge_kb(arena.memory.data_ptr()) >= HUGE_PAGE // 1024


@pytest.mark.skipif(available() is not None, reason=str(available()))
def test_without_a_mapping_the_weights_stay_where_they_are(monkeypatch) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise OSError("Cannot allocate memory")

    linear = Int4Linear.from_blocks(quantize_q4_1(torch.randn(32, 64)))
    where = [t.data_ptr() for t in linear.tensors()]
    monkeypatch.setattr("model.runtime.huge_pages.mmap.mmap", refused)
    assert onto_huge_pages([linear]) is None
    assert [t.data_ptr() for t in linear.tensors()] == where
