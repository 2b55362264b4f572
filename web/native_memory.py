"""Keep a long-running server's native heap from creeping: fewer malloc arenas, freed pages given back.

glibc's malloc keeps freed memory in per-thread arenas for reuse. A voice server runs Whisper, the LM and Piper from
dozens of worker threads, so after a burst of concurrent turns each arena holds on to its own peak, and the process's
resident memory stays high although nothing is allocated any more. `limit_malloc_arenas` caps the number of arenas
(at start-up), `release_free_memory` (`malloc_trim(0)`) hands free pages back (when a session ends). Only glibc has
them; on other C libraries both do nothing and return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

M_ARENA_MAX = -8  # glibc's mallopt parameter number


@functools.cache
def _libc_function(name: str, argtypes: tuple[type, ...]) -> Callable[..., int] | None:
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    try:
        function = getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


def limit_malloc_arenas(count: int) -> bool:
    """Cap glibc's arenas (default 8 per core) before worker threads start: each arena keeps its own peak, so dozens
    of threads taking turns on the models would each hold on to a copy of the largest turn's working memory."""
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    return mallopt is not None and mallopt(M_ARENA_MAX, count) == 1


def release_free_memory() -> bool:
    """Return free heap pages to the OS (blocking, a few ms for a large heap); False when the C library cannot."""
    trim = _libc_function("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)  # its result only says whether any page happened to be released
    return True
