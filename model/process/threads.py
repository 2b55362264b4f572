"""The one place this project sets thread counts for the LM: torch's (its intra-op pool: the LM's torch operations)
and the C kernels' (every pass's layers and head: model/runtime/kernels/). A reader finds every change by these names.

`set_torch_threads` is for a process's start (a command's `--threads`, a voice process before its model loads);
`torch_threads` for a probe at load time that must run on another count and give it back. torch's count is the
process's, so nothing changes it while answers are served. A pass's team is the calling thread's own instead:
`kernel_team` sets it for a block on that thread (the batch runner, per pass, as the CPU budget grants it:
model/process/cpu_budget.py) and the kernels read it with `kernel_threads`.
"""

from __future__ import annotations

import contextlib
import threading
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


class _Team(threading.local):
    threads: int | None = None


_team = _Team()


def kernel_threads() -> int:
    """The C kernels' threads for a call from this thread: its `kernel_team`, else torch's count."""
    return _team.threads or torch.get_num_threads()


@contextlib.contextmanager
def kernel_team(threads: int) -> Iterator[None]:
    """The C kernels called from this thread inside the block run on `threads` (other threads are untouched)."""
    previous, _team.threads = _team.threads, threads
    try:
        yield
    finally:
        _team.threads = previous
