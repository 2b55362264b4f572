"""The packed weights moved onto 2 MB pages: one anonymous mapping, advised for transparent huge pages, that holds
every weight a decoding pass streams, in the order the pass reads them.

Why: a pass of one row is bound by reading its weights (~96 MB for the bundled model: the layers' Q4_1 and the Q8_0
head), and torch's allocator leaves them on 4 KB pages, where every 4 KB of the stream is a TLB miss and the
hardware prefetcher stops at each page's end. On the 2-core AMD EPYC (AVX-512), a stream of 96 MB read 24.9 against
33.8 GB/s (1 thread) and 40.6 against 45.3 (2 threads) on 4 KB and 2 MB pages; the bundled model's layer matmuls
and head for one row, the same kernels on either copy, took 3.09 against 2.59 ms and 0.80 against 0.57 ms at 2
threads (4.76 against 3.69 and 1.48 against 1.07 at 1). Linux gives a mapping huge pages when asked
(`MADV_HUGEPAGE`) unless transparent huge pages are off ("never"); elsewhere the copy is ordinary memory and
nothing else changes: the same bytes, the same results.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterable

import torch

from model.runtime.packed import PackedLinear

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line


class Arena:
    """`size` bytes of anonymous memory starting on a 2 MB boundary, advised for huge pages where the OS has them;
    `place` copies tensors into it one after another. The tensors it returns keep the mapping alive."""

    def __init__(self, size: int) -> None:
        mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advise = getattr(mapping, "madvise", None)
        if advise is not None and hasattr(mmap, "MADV_HUGEPAGE"):
            advise(mmap.MADV_HUGEPAGE)  # before the first touch: the copies then fault in whole 2 MB pages
        memory = torch.frombuffer(mapping, dtype=torch.uint8)
        start = -memory.data_ptr() % HUGE_PAGE
        self.memory = memory[start : start + size]
        self.used = 0

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of `tensor` (contiguous) in the arena."""
        size = tensor.numel() * tensor.element_size()
        if self.used + size > self.memory.numel():
            raise ValueError(f"the arena holds {self.memory.numel()} bytes: {self.used + size} asked")
        copy = self.memory[self.used : self.used + size].view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor)
        self.used = -(-(self.used + size) // ALIGN) * ALIGN
        return copy


def _bytes(linears: Iterable[PackedLinear]) -> int:
    return sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for linear in linears for t in linear.tensors())


def onto_huge_pages(linears: list[PackedLinear]) -> Arena | None:
    """Move `linears`' tensors (in this order: the order a pass reads them) into one arena; None when there is
    nothing to move, or no anonymous mapping to move them to (another OS, or none granted): they then stay where
    they are, as fast as before."""
    size = _bytes(linears)
    if not size or not hasattr(mmap, "MAP_PRIVATE"):
        return None
    try:
        arena = Arena(size)
    except OSError as error:
        log.warning("the weights stay on their pages: no %d-byte mapping for them (%s)", size, error)
        return None
    for linear in linears:
        linear.move(arena.place)
    return arena
