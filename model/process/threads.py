"""The one place this project sets torch's thread count (its intra-op pool: the LM's passes, the int4 kernels' torch
glue). Everything else asks for a count here, so a reader finds every change of it by one name.

`set_torch_threads` is for a process's start (a command's `--threads`, a voice process before its model loads: the
batch runner's thread keeps the count it starts with); `torch_threads` for a span that must run on another count and
give it back (a probe at load time, a wider team for one pass).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def set_torch_threads(threads: int) -> None:
    """torch's intra-op threads from now on."""
    torch.set_num_threads(threads)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads are `threads` inside the block and what they were before after it (untouched when
    they are `threads` already)."""
    previous = torch.get_num_threads()
    if threads == previous:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
