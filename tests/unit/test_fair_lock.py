"""FairLock: first come, first served, and a waiter whose session has gone leaves the queue."""

from __future__ import annotations

import threading

import pytest

from model.fair_lock import FairLock


def wait_until(predicate, timeout_s: float = 10.0) -> None:
    event = threading.Event()
    for _ in range(int(timeout_s / 0.005)):
        if predicate():
            return
        event.wait(0.005)
    raise AssertionError("condition not reached")


def queue_waiters(
    lock: FairLock, names: list[str], order: list[str], cancels: dict[str, threading.Event], urgent: bool = False
):
    """Start one waiter per name, each only once the previous one is queued, so arrival order is known."""
    threads = []
    for name in names:
        cancel = cancels.get(name)

        def wait_for_turn(name: str = name, cancel: threading.Event | None = cancel) -> None:
            if lock.acquire(cancel, urgent=urgent):
                order.append(name)
                lock.release()
            else:
                order.append(f"{name} gave up")

        before = lock.waiting
        thread = threading.Thread(target=wait_for_turn, name=name)
        thread.start()
        wait_until(lambda before=before: lock.waiting == before + 1)
        threads.append(thread)
    return threads


def test_waiters_get_the_lock_in_arrival_order() -> None:
    lock = FairLock()
    order: list[str] = []
    lock.acquire()
    names = [f"waiter-{i}" for i in range(6)]
    threads = queue_waiters(lock, names, order, {})
    lock.release()
    for thread in threads:
        thread.join(timeout=10)
    assert order == names
    assert not lock.locked() and lock.waiting == 0


def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_proceeds() -> None:
    lock = FairLock(poll_s=0.01)
    order: list[str] = []
    cancels = {"gone": threading.Event()}
    lock.acquire()
    threads = queue_waiters(lock, ["gone", "next"], order, cancels)
    cancels["gone"].set()
    wait_until(lambda: order == ["gone gave up"])  # while the lock is still held: it left the queue by itself
    assert lock.waiting == 1
    lock.release()
    for thread in threads:
        thread.join(timeout=10)
    assert order == ["gone gave up", "next"]


def test_a_free_lock_is_taken_at_once_and_releasing_it_twice_is_an_error() -> None:
    lock = FairLock()
    assert lock.acquire(threading.Event()) is True
    lock.release()
    with pytest.raises(RuntimeError, match="unlocked"):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()


def test_an_urgent_waiter_goes_ahead_of_ordinary_ones_but_behind_earlier_urgent_ones() -> None:
    lock = FairLock()
    order: list[str] = []
    lock.acquire()
    threads = queue_waiters(lock, ["partial-1", "partial-2"], order, {})
    threads += queue_waiters(lock, ["final-1", "final-2"], order, {}, urgent=True)
    threads += queue_waiters(lock, ["partial-3"], order, {})
    lock.release()
    for thread in threads:
        thread.join(timeout=10)
    assert order == ["final-1", "final-2", "partial-1", "partial-2", "partial-3"]
    assert not lock.locked() and lock.waiting == 0
    with lock.urgently():  # the context form holds the lock and gives it back
        assert lock.locked()
    assert not lock.locked()


def test_an_urgent_waiter_that_gives_up_keeps_the_order_of_the_rest() -> None:
    lock = FairLock(poll_s=0.01)
    order: list[str] = []
    gone = threading.Event()
    lock.acquire()
    threads = queue_waiters(lock, ["partial"], order, {})
    threads += queue_waiters(lock, ["final-gone", "final"], order, {"final-gone": gone}, urgent=True)
    gone.set()
    wait_until(lambda: "final-gone gave up" in order)
    threads += queue_waiters(lock, ["final-late"], order, {}, urgent=True)
    lock.release()
    for thread in threads:
        thread.join(timeout=10)
    assert order == ["final-gone gave up", "final", "final-late", "partial"]
