"""The packed weights moved onto 2 MB pages: one anonymous mapping, advised for transparent huge pages, that holds
every weight a decoding pass streams, in the order the pass reads them.

Why: a pass of one row is bound by reading its weights (~96 MB for the bundled model: the layers' Q4_1 and the Q8_0
head), and they sat on 4 KB pages (the packed cache file's, or torch's), where the stream takes a TLB miss every 4 KB
and the hardware prefetcher stops at each page's end. On the 2-core AMD EPYC (AVX-512) a 96 MB stream read 24.9
against 33.8 GB/s on one core (40.6 against 45.3 on two) on 4 KB and 2 MB pages, and a lone pass of the bundled
model at 1 thread took 6.22 ms on the cache file's pages, 6.00 on 4 KB copies, 5.75 here (alternated in one
process); at 2 threads 4.10-4.14 on each: two cores' pass is not bound by one core's stream. Linux gives a mapping
huge pages when asked (`MADV_HUGEPAGE`) unless transparent huge pages are off ("never"); elsewhere the copy is
ordinary memory and nothing else changes: the same bytes, the same results.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from collections.abc import Callable, Iterable

import torch

from model.runtime.batching import round_up
from model.runtime.packed import PackedLinear

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line
TRIM_EVERY = 16 << 20  # bytes moved between two returns of the freed originals to the OS


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
        size = tensor.nbytes
        if self.used + size > self.memory.numel():
            raise ValueError(f"the arena holds {self.memory.numel()} bytes: {self.used + size} asked")
        copy = self.memory[self.used : self.used + size].view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor)
        self.used = round_up(self.used + size, ALIGN)
        return copy


def _bytes(linears: Iterable[PackedLinear]) -> int:
    return sum(round_up(t.nbytes, ALIGN) for linear in linears for t in linear.tensors())


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
    trim = _trimmer()
    moved = 0
    for linear in linears:
        linear.move(arena.place)  # the old tensors are freed here, unless something else holds them
        moved += sum(t.nbytes for t in linear.tensors())
        if moved >= TRIM_EVERY:
            trim()
            moved = 0
    trim()
    return arena


def _trimmer() -> Callable[[], None]:
    """glibc's `malloc_trim(0)`, which gives the pages of freed memory back to the OS (the copies' originals, freed
    as they go, would otherwise stay resident beside the arena and double the load's peak); a no-op elsewhere."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int

    def run() -> None:
        trim(0)

    return run
