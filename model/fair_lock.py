"""A lock granted in the order it was asked for, whose waiters can give up.

One model instance serves every session of a process, so sessions queue for it. `threading.Lock` wakes an arbitrary
waiter, so under load one session could wait through several other sessions' answers in a row; and a thread blocked in
`Lock.acquire()` cannot notice that its session has gone, so a dead session's work would still run when its turn came.
`FairLock` hands the model over first come, first served, and a waiter whose `cancel` event is set leaves the queue
within `poll_s`.
"""

from __future__ import annotations

import threading
from collections import deque
from types import TracebackType


class FairLock:
    """FIFO mutual exclusion; `with lock:` waits without a cancel flag, `acquire(cancel)` with one."""

    def __init__(self, poll_s: float = 0.05) -> None:
        self.poll_s = poll_s
        self._condition = threading.Condition()
        self._queue: deque[object] = deque()  # one ticket per waiter, in arrival order
        self._held = False

    @property
    def waiting(self) -> int:
        """How many threads are queued for the lock now."""
        with self._condition:
            return len(self._queue)

    def locked(self) -> bool:
        with self._condition:
            return self._held

    def acquire(self, cancel: threading.Event | None = None) -> bool:
        """Wait for every earlier waiter, then take the lock: True. False (not holding it) once `cancel` is set."""
        ticket = object()
        with self._condition:
            self._queue.append(ticket)
            try:
                while self._held or self._queue[0] is not ticket:
                    if cancel is not None and cancel.is_set():
                        self._leave(ticket)
                        return False
                    self._condition.wait(self.poll_s if cancel is not None else None)
            except BaseException:  # interrupted while waiting: never leave a ticket that blocks everyone behind it
                self._leave(ticket)
                raise
            self._queue.popleft()
            self._held = True
            return True

    def release(self) -> None:
        with self._condition:
            if not self._held:
                raise RuntimeError("FairLock.release() called on an unlocked lock")
            self._held = False
            self._condition.notify_all()

    def _leave(self, ticket: object) -> None:
        self._queue.remove(ticket)
        self._condition.notify_all()  # the waiter behind this one may now be first

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
