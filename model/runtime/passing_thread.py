"""Run one call on a thread that ends when the call returns, so that the OpenMP workers it started end with it.

Why this exists: torch's CPU build parallelises with GNU OpenMP (libgomp), and libgomp gives every thread that runs a
parallel region its own team of worker threads, kept until that thread exits. Loading a model runs parallel ops (weight
copies, dtype conversions) on the caller's thread, usually the main thread, whose team then lives for the whole process.
The passes run on another thread (the batch runner's, or a server worker's), which gets a second team. With more OpenMP
threads than cores, libgomp stops spin-waiting between parallel regions (its "throttled" spin count) and parks workers
instead, so every small matmul of a pass waits for its workers to be woken. On the 2-core machine a self-speculative
pass of the bundled model took 117 ms after a main-thread load against 69 ms after a load on a passing thread (p50 of
88 passes, `scripts/bench/bench_lm.py` shows the same ratio). Loading on a thread that then exits leaves one team: the
one of the thread that runs the passes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def run_in_passing_thread(call: Callable[[], T], name: str = "model-load") -> T:
    """Return `call()`, computed on a fresh thread that has exited by the time this returns; its exception is
    re-raised here. Ctrl+C while waiting interrupts the caller (the daemon thread is abandoned with the process)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as error:  # handed to the caller, who raises it
            failure.append(error)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def on_passing_thread(function: Callable[P, T]) -> Callable[P, T]:
    """Decorator: every call of `function` runs on its own passing thread (`run_in_passing_thread`)."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return run_in_passing_thread(lambda: function(*args, **kwargs), name=f"{function.__name__}")

    return wrapper
