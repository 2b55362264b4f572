"""relay_drafts: a blocking draft iterator pulled on a worker thread, its drafts handed to the event loop in order,
closed by the thread that holds it, and stopped by a done draft, the cancel flag, or a closed loop; and its two
callers, the voice session's LmRun and the API's Scheduler, each ending a failed answer with its own error."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from model.chat import ChatMessage, Draft, DraftPiece, GenerationOptions
from model.chat.draft_relay import relay_drafts
from model.errors import ModelError
from model.server.scheduler import GenerationCrashed, Scheduler, SchedulerStats
from voice.think.lm_run import LmRun


def draft(step: int, done: bool = False) -> Draft:
    return Draft(step, (DraftPiece(f" w{step}", True),), done=done, finish_reason="stop" if done else None)


class Drafts:
    """A model's draft generator that records what it yielded, on which thread it was closed, and what it saw."""

    def __init__(self, count: int, done_at: int | None = None, fail_at: int | None = None) -> None:
        self.count = count
        self.done_at = done_at
        self.fail_at = fail_at
        self.yielded: list[int] = []
        self.closed_on: str | None = None

    def __call__(self) -> Iterator[Draft]:
        try:
            for step in range(self.count):
                if step == self.fail_at:
                    raise RuntimeError("a bug in the model")
                self.yielded.append(step)
                yield draft(step, done=step == self.done_at)
        finally:
            self.closed_on = threading.current_thread().name


def relayed(drafts: Drafts, cancel: threading.Event | None = None, cancel_after: int | None = None,
            ) -> tuple[list[tuple[int, Draft]], list[str], BaseException | None]:
    cancel = cancel or threading.Event()
    observed: list[str] = []

    def observe(item: Draft) -> None:
        observed.append(threading.current_thread().name)
        if item.step == cancel_after:
            cancel.set()

    async def scenario() -> tuple[list[tuple[int, Draft]], BaseException | None]:
        handed: list[tuple[int, Draft]] = []
        with ThreadPoolExecutor(1, thread_name_prefix="relay-test") as threads:
            future = relay_drafts(drafts, lambda t_ns, item: handed.append((t_ns, item)), cancel, executor=threads,
                                  observe=observe)
            error = None
            try:
                await future
            except Exception as raised:
                error = raised
        return handed, error

    handed, error = asyncio.run(scenario())
    return handed, observed, error


def test_drafts_reach_the_loop_in_order_until_the_done_one_and_the_thread_closes_them() -> None:
    drafts = Drafts(6, done_at=3)
    before = time.monotonic_ns()
    handed, observed, error = relayed(drafts)
    assert error is None
    assert [item.step for _, item in handed] == [0, 1, 2, 3] and drafts.yielded == [0, 1, 2, 3]
    stamps = [t_ns for t_ns, _ in handed]
    assert before <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= time.monotonic_ns()
    assert drafts.closed_on is not None and drafts.closed_on.startswith("relay-test")
    assert len(observed) == 4 and all(name.startswith("relay-test") for name in observed)


def test_a_set_cancel_flag_stops_the_relay_after_the_draft_in_hand() -> None:
    drafts = Drafts(6)
    cancel = threading.Event()
    handed, _, error = relayed(drafts, cancel, cancel_after=1)
    assert error is None and cancel.is_set()
    assert [item.step for _, item in handed] == [0, 1] and drafts.yielded == [0, 1]
    assert drafts.closed_on is not None and drafts.closed_on.startswith("relay-test")


def test_the_models_error_reaches_the_awaiting_caller_after_the_drafts_before_it() -> None:
    handed, _, error = relayed(Drafts(6, fail_at=2))
    assert isinstance(error, RuntimeError) and str(error) == "a bug in the model"
    assert [item.step for _, item in handed] == [0, 1]


def test_an_error_opening_the_drafts_reaches_the_caller() -> None:
    def refuses() -> Iterator[Draft]:
        raise ModelError("the prompt is too long")

    async def scenario() -> None:
        await relay_drafts(refuses, lambda t_ns, item: None, threading.Event())

    with pytest.raises(ModelError, match="too long"):
        asyncio.run(scenario())


def test_a_plain_iterator_is_relayed_too() -> None:
    async def scenario() -> list[int]:
        handed: list[int] = []
        await relay_drafts(lambda: iter([draft(0), draft(1, done=True), draft(2)]),
                           lambda t_ns, item: handed.append(item.step), threading.Event())
        return handed

    assert asyncio.run(scenario()) == [0, 1]


def test_a_loop_that_closed_under_the_thread_cancels_the_drafts() -> None:
    release = threading.Event()
    drafts = Drafts(6)

    def waiting() -> Iterator[Draft]:
        release.wait(10)
        yield from drafts()

    cancel = threading.Event()
    threads = ThreadPoolExecutor(1, thread_name_prefix="relay-test")
    loop = asyncio.new_event_loop()

    async def start() -> None:
        relay_drafts(waiting, lambda t_ns, item: None, cancel, executor=threads)

    loop.run_until_complete(start())
    loop.close()
    release.set()
    threads.shutdown(wait=True)
    assert cancel.is_set() and drafts.yielded == [0]
    assert drafts.closed_on is not None and drafts.closed_on.startswith("relay-test")


class FailingLM:
    """A chat model whose drafts fail at the third pass, with `error`."""

    name = "failing"

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.closed = threading.Event()

    def stream_chat(self, messages: Sequence[ChatMessage], options: GenerationOptions,
                    cancel: threading.Event | None = None) -> Iterator[Draft]:
        try:
            yield draft(0)
            yield draft(1)
            raise self.error
        finally:
            self.closed.set()


@pytest.mark.parametrize("error", [ModelError("no room for this prompt"), RuntimeError("a bug in the model")])
def test_a_voice_turn_gets_the_drafts_then_a_model_error(error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(lm: FailingLM) -> tuple[list[int], ModelError]:
        run = LmRun(lm, [ChatMessage("user", "hi")], GenerationOptions(), name="lm-test")
        steps: list[int] = []
        with pytest.raises(ModelError) as raised:
            async for _, item in run.drafts():
                steps.append(item.step)
        await run.close()
        return steps, raised.value

    lm = FailingLM(error)
    steps, raised = asyncio.run(scenario(lm))
    assert steps == [0, 1] and lm.closed.is_set()
    if isinstance(error, ModelError):
        assert raised is error and not caplog.records
    else:
        assert str(raised) == "the language model failed: a bug in the model"
        assert [record.message for record in caplog.records] == ["language model failed"]


@pytest.mark.parametrize("error", [ModelError("no room for this prompt"), RuntimeError("a bug in the model")])
def test_an_api_job_gets_the_drafts_then_its_error_and_is_counted(error: Exception) -> None:
    async def scenario() -> tuple[list[int], ModelError, SchedulerStats]:
        scheduler = Scheduler(FailingLM(error), max_queue=4)
        job = scheduler.submit([ChatMessage("user", "hi")], GenerationOptions())
        steps: list[int] = []
        with pytest.raises(ModelError) as raised:
            async for item in job.stream():
                steps.append(item.step)
        await scheduler.close()
        return steps, raised.value, scheduler.stats

    steps, raised, stats = asyncio.run(scenario())
    assert steps == [0, 1]
    if isinstance(error, ModelError):
        assert raised is error and (stats.refused, stats.failed) == (1, 0)
    else:
        assert isinstance(raised, GenerationCrashed)
        assert str(raised) == "generation failed: RuntimeError: a bug in the model"
        assert (stats.refused, stats.failed) == (0, 1)
