"""release_free_memory: freed heap pages really leave the process (glibc)."""

from __future__ import annotations

import os
import platform

import pytest

from web.native_memory import release_free_memory


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_memory_is_returned_to_the_system() -> None:
    # 64 KiB buffers come from malloc's heap (below the mmap threshold); keeping every tenth one fragments it, so
    # freeing the others leaves ~170 MiB of free pages between live blocks, which only malloc_trim hands back
    buffers = [bytearray(b"x" * (64 * 1024)) for _ in range(3000)]
    pins = buffers[9::10]
    del buffers
    before = rss_mb()
    assert release_free_memory() is True
    after = rss_mb()
    assert before - after > 100, f"RSS {before:.0f} -> {after:.0f} MiB"
    assert all(pin[0] == ord("x") for pin in pins)
