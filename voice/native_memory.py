"""Give freed native memory back to the operating system when a session ends.

glibc's malloc keeps freed memory in per-thread arenas for reuse. A voice server runs Whisper, the LM and Piper from
dozens of worker threads, so after a burst of concurrent turns each arena holds on to its own peak, and the process's
resident memory stays high although nothing is allocated any more. `malloc_trim(0)` hands those pages back. Only glibc
has it; on other C libraries this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return free heap pages to the OS (blocking, a few ms for a large heap); False when the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)  # its result only says whether any page happened to be released
    return True
