"""A lock granted in the order it was asked for, whose waiters can give up.

One model instance serves every session of a process, so sessions queue for it. `threading.Lock` wakes an arbitrary
waiter, so under load one session could wait through several other sessions' answers in a row; and a thread blocked in
`Lock.acquire()` cannot notice that its session has gone, so a dead session's work would still run when its turn came.
`FairLock` hands the model over first come, first served, and a waiter whose `cancel` event is set leaves the queue
within `poll_s`. An *urgent* waiter (a turn's final transcript, which someone is waiting to hear answered) goes ahead of
every ordinary waiter (another session's partial transcript), still behind earlier urgent ones, so several people
speaking at once do not make each other's final decodes wait behind a queue of partials.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class FairLock:
    """FIFO mutual exclusion; `with lock:` waits without a cancel flag, `acquire(cancel)` with one."""

    def __init__(self, poll_s: float = 0.05) -> None:
        self.poll_s = poll_s
        self._condition = threading.Condition()
        self._queue: deque[object] = deque()  # one ticket per waiter: urgent ones first, each kind in arrival order
        self._urgent = 0  # how many tickets at the head of the queue are urgent
        self._held = False

    @property
    def waiting(self) -> int:
        """How many threads are queued for the lock now."""
        with self._condition:
            return len(self._queue)

    def locked(self) -> bool:
        with self._condition:
            return self._held

    def acquire(self, cancel: threading.Event | None = None, urgent: bool = False) -> bool:
        """Wait for every earlier waiter (every ordinary one too when `urgent`), then take the lock: True. False (not
        holding it) once `cancel` is set."""
        ticket = object()
        with self._condition:
            if urgent:
                self._queue.insert(self._urgent, ticket)
                self._urgent += 1
            else:
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
            if urgent:  # urgent tickets are the head of the queue: this was the first of them
                self._urgent -= 1
            self._held = True
            return True

    @contextmanager
    def urgently(self) -> Iterator[None]:
        """`with lock.urgently():` holds the lock, taken ahead of every ordinary waiter."""
        self.acquire(urgent=True)
        try:
            yield
        finally:
            self.release()

    def release(self) -> None:
        with self._condition:
            if not self._held:
                raise RuntimeError("FairLock.release() called on an unlocked lock")
            self._held = False
            self._condition.notify_all()

    def _leave(self, ticket: object) -> None:
        if self._queue.index(ticket) < self._urgent:
            self._urgent -= 1
        self._queue.remove(ticket)
        self._condition.notify_all()  # the waiter behind this one may now be first

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
