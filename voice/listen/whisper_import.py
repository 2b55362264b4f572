"""Import faster-whisper so that CTranslate2 keeps its own OpenMP runtime instead of sharing torch's.

Why: torch loads its libgomp with RTLD_GLOBAL, so CTranslate2 (which ships its own copy, `ctranslate2.libs/libgomp-*`)
binds to torch's instead when it is imported after torch. One runtime then counts both thread teams: CTranslate2's
worker thread keeps a team of `cpu_threads` for the model's life and the LM's batch runner keeps another, and with
more OpenMP threads than cores libgomp stops spin-waiting between parallel regions. Every small matmul of an LM pass
then waits for its workers to be woken: a self-speculative pass of the bundled model took 122-128 ms with tiny.en
loaded against 67-69 ms with CTranslate2 on its own runtime (2-core machine, p50 of 75 passes), and the Whisper decode
cost the same either way (80-84 ms on 3 s of audio). RTLD_DEEPBIND makes CTranslate2's libraries look up their own
dependencies first, whatever was imported before them.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType


def import_faster_whisper() -> ModuleType:
    """`faster_whisper`, with `ctranslate2` imported first on its own OpenMP runtime (no-op once imported)."""
    if "ctranslate2" not in sys.modules and hasattr(os, "RTLD_DEEPBIND"):
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | os.RTLD_DEEPBIND)
        try:
            import ctranslate2  # noqa: F401
        finally:
            sys.setdlopenflags(flags)
    import faster_whisper

    return faster_whisper
