"""A model's blocking draft iterator pulled on a worker thread, its drafts handed to the event loop as they come.

`ChatModel.stream_chat` blocks for a whole pass per draft, so no caller on an event loop may iterate it there: the
voice session's `LmRun` and the API server's `Scheduler` both pull it with `relay_drafts`. The thread that iterates
the drafts also closes them, because closing is what frees the model's lock or batch slot at once, and a generator
may only be closed by the thread that runs it. The caller's cancel flag is the model's too (it stops within one
pass); the relay stops pulling as soon as it is set, after a done draft, or when the event loop has closed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Executor

from model.chat import Draft


def relay_drafts(
    open_drafts: Callable[[], Iterator[Draft]],
    hand: Callable[[int, Draft], None],
    cancel: threading.Event,
    *,
    executor: Executor | None = None,
    observe: Callable[[Draft], None] | None = None,
) -> asyncio.Future[None]:
    """Start pulling `open_drafts()` on a thread of `executor` (the running loop's default one when None).

    Every draft goes to `hand(t_ns, draft)` on the loop, in order; `t_ns` is when the thread got it
    (`time.monotonic_ns()`), since the loop may run the call later. `observe(draft)`, if given, sees each draft first,
    on the thread. The returned future ends once the thread has closed the drafts, after every `hand` call it made,
    and raises what `open_drafts` or the drafts raised: mapping a model's errors is the caller's.
    """
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(executor, _pull, loop, open_drafts, hand, cancel, observe)


def _pull(
    loop: asyncio.AbstractEventLoop,
    open_drafts: Callable[[], Iterator[Draft]],
    hand: Callable[[int, Draft], None],
    cancel: threading.Event,
    observe: Callable[[Draft], None] | None,
) -> None:
    """The worker thread's side of `relay_drafts`."""
    drafts = open_drafts()
    try:
        for draft in drafts:
            received_ns = time.monotonic_ns()
            if observe is not None:
                observe(draft)
            try:
                loop.call_soon_threadsafe(hand, received_ns, draft)
            except RuntimeError:  # the event loop closed under us (shutdown): nobody is listening any more
                cancel.set()
                return
            if draft.done or cancel.is_set():
                return
    finally:
        if isinstance(drafts, Generator):  # a plain iterator holds nothing to free
            drafts.close()
