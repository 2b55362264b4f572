"""cancel_and_wait: waits for a cancelled task's cleanup, is bounded, and never swallows the caller's cancellation."""

from __future__ import annotations

import asyncio
import logging

import pytest

from voice.cancellation import cancel_and_wait


async def _cleans_up_slowly(log: list[str]) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)  # cleanup that takes a while, e.g. a thread finishing its chunk
        log.append("cleaned up")
        raise


def test_waits_until_the_cancelled_task_has_finished_its_cleanup():
    async def scenario() -> tuple[list[str], asyncio.Task]:
        log: list[str] = []
        task = asyncio.create_task(_cleans_up_slowly(log), name="slow")
        await asyncio.sleep(0)
        await cancel_and_wait(task, None)
        return log, task

    log, task = asyncio.run(scenario())
    assert log == ["cleaned up"] and task.cancelled()


def test_skips_none_and_finished_tasks_and_leaves_their_outcome_to_the_caller():
    async def fails() -> None:
        raise ValueError("boom")

    async def scenario() -> asyncio.Task:
        task = asyncio.create_task(fails())
        await asyncio.wait({task})
        await cancel_and_wait(None, task)
        return task

    task = asyncio.run(scenario())
    assert isinstance(task.exception(), ValueError)


def test_a_task_that_ignores_cancellation_costs_a_warning_not_a_hang(caplog):
    async def stubborn(release: asyncio.Event) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    async def scenario() -> bool:
        release = asyncio.Event()
        task = asyncio.create_task(stubborn(release), name="stubborn")
        await asyncio.sleep(0)
        await cancel_and_wait(task, timeout_s=0.1)
        still_running = not task.done()
        release.set()
        await task
        return still_running

    with caplog.at_level(logging.WARNING, logger="voice.cancellation"):
        assert asyncio.run(scenario())
    assert "stubborn did not finish within 0.1 s" in caplog.text


def test_the_callers_own_cancellation_is_raised_not_swallowed():
    async def scenario() -> tuple[bool, list[str]]:
        log: list[str] = []
        inner = asyncio.create_task(_cleans_up_slowly(log), name="inner")
        reached_end = False

        async def caller() -> None:
            nonlocal reached_end
            await asyncio.sleep(0)
            await cancel_and_wait(inner)
            reached_end = True

        outer = asyncio.create_task(caller(), name="caller")
        await asyncio.sleep(0.01)  # the caller is now waiting for inner's cleanup
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        await asyncio.gather(inner, return_exceptions=True)
        return reached_end, log

    reached_end, log = asyncio.run(scenario())
    assert not reached_end and log == ["cleaned up"]
