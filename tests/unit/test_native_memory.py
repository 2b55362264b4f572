"""release_free_memory: freed heap pages really leave the process (glibc).

The scenario runs in a fresh interpreter: how much of the heap malloc_trim can hand back depends on everything the
process allocated before (other tests, loaded models), so in the test process itself the figure varied with test order.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

SCENARIO = """
import json, os
from web.native_memory import release_free_memory

def rss_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

# 64 KiB buffers come from malloc's heap (below the mmap threshold); keeping every tenth one fragments it, so freeing
# the others leaves ~170 MiB of free pages between live blocks, which only malloc_trim hands back
buffers = [bytearray(b"x" * (64 * 1024)) for _ in range(3000)]
pins = buffers[9::10]
del buffers
before = rss_mb()
released = release_free_memory()
after = rss_mb()
print(json.dumps({"released": released, "before": before, "after": after,
                  "pins_intact": all(pin[0] == ord("x") for pin in pins)}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_memory_is_returned_to_the_system() -> None:
    done = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["released"] is True
    assert result["before"] - result["after"] > 100, f"RSS {result['before']:.0f} -> {result['after']:.0f} MiB"
    assert result["pins_intact"]
