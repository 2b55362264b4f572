"""Cancel tasks and wait until they have really stopped: the one cancel-and-wait of the pipeline and the server.

A cancelled task may still be running cleanup (closing a model iterator, waiting for a thread's chunk); whoever
cancels it must not move on as if it were gone, or work outlives its turn or its connection. The wait is bounded, so a
stuck task costs a warning instead of a hang, and it never swallows the caller's own cancellation.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

CANCEL_WAIT_SECONDS = 10.0


async def cancel_and_wait(*tasks: asyncio.Task | None, timeout_s: float = CANCEL_WAIT_SECONDS) -> None:
    """Cancel `tasks` (None and finished ones are skipped) and wait up to `timeout_s` until each has finished.

    The tasks' own outcomes (cancelled, a result, an exception) are left on the tasks for the caller to read. If the
    caller is cancelled while waiting, its `CancelledError` propagates (the tasks stay cancelled).
    """
    pending = {task for task in tasks if task is not None and not task.done()}
    for task in pending:
        task.cancel()
    if not pending:
        return
    # asyncio.wait neither raises the tasks' exceptions nor cancels them, but does raise the caller's own cancellation
    _, still_running = await asyncio.wait(pending, timeout=timeout_s)
    for task in still_running:
        log.warning("task %s did not finish within %.1f s of cancellation", task.get_name(), timeout_s)
