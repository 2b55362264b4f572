"""Generations on one model, started in arrival order, with per-request cancellation.

A worker task takes jobs from a FIFO queue and runs each job's whole `stream_chat` iteration in a worker thread of
the scheduler's own pool, so the event loop never blocks. Up to `model.max_batch` jobs run at once (a model that
batches concurrent answers into one forward, model/runtime/batch_runner.py; 1 for any other model, which then answers
one job at a time, in order). Drafts cross back to the loop through `relay_drafts` (model/chat/draft_relay.py), the
voice session's way too. A request that goes away sets its
job's cancel flag: a queued job is skipped, a running one stops within one refinement pass because the model checks
the same `threading.Event` between passes. Nothing here awaits on behalf of a dead client, so a client that disconnects
can never stall the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from model.chat import BatchesAnswers, ChatMessage, ChatModel, Draft, GenerationOptions, TokenizingChatModel
from model.chat.draft_relay import relay_drafts
from model.errors import ModelError

log = logging.getLogger(__name__)


class QueueFull(ModelError):
    """The server already holds as many generations as it may; the client should retry later."""


class GenerationCrashed(ModelError):
    """The model raised something other than `ModelError`: a bug or a resource failure, not the request's fault."""


class ShuttingDown(ModelError):
    """The server stopped this generation because it is shutting down."""


@dataclass(slots=True)
class SchedulerStats:
    """Counters for tests, the bench script and logs. Mutated only on the event loop."""

    submitted: int = 0
    completed: int = 0
    cancelled: int = 0  # jobs stopped before their final draft (client gone, shutdown)
    refused: int = 0  # the model raised ModelError: a request it cannot answer (empty chat, prompt too long)
    failed: int = 0  # the model crashed (GenerationCrashed)
    rejected: int = 0  # refused because the queue was full


@dataclass(slots=True, eq=False)
class Job:
    """One request's generation. `drafts` receives every Draft, then None; `error` is set if the model failed."""

    messages: tuple[ChatMessage, ...]
    options: GenerationOptions
    prompt: tuple[int, ...] | None = None  # the chat already tokenized (and checked) by the request handler
    cancel: threading.Event = field(default_factory=threading.Event)
    drafts: asyncio.Queue[Draft | None] = field(default_factory=asyncio.Queue)
    error: ModelError | None = None
    finished: bool = False  # the model yielded its final (done) draft

    async def stream(self) -> AsyncIterator[Draft]:
        """The job's drafts as they come; raises the model's error if it failed. Cancels the job if abandoned."""
        try:
            while (draft := await self.drafts.get()) is not None:
                yield draft
            if self.error is not None:
                raise self.error
        finally:
            self.cancel.set()  # no-op once finished; otherwise the client left or stopped reading


class Scheduler:
    """A fair (FIFO) queue in front of one `ChatModel`, starting up to `model.max_batch` jobs at once. Create and use
    it inside one running event loop."""

    def __init__(self, model: ChatModel, max_queue: int, on_draft: Callable[[Draft], None] | None = None) -> None:
        self.model = model
        self.max_queue = max_queue
        self._on_draft = on_draft  # called in the job's worker thread for every draft (the server's metrics)
        self.stats = SchedulerStats()
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._pending = 0  # queued + running
        self._worker: asyncio.Task[None] | None = None
        self._running: set[Job] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.concurrency = max(1, model.max_batch) if isinstance(model, BatchesAnswers) else 1
        # its own threads: a job's thread is held for its whole answer, and asyncio's default pool has only 6 on 2 cores
        self._threads = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="dlm-job")
        self._idle = asyncio.Event()  # set while nothing is queued or running
        self._idle.set()
        self._closed = False

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        return self._pending

    @property
    def running(self) -> int:
        """Jobs decoding now."""
        return len(self._running)

    @property
    def accepting(self) -> bool:
        """Whether a job submitted now would be queued (not shutting down, room in the queue)."""
        return not self._closed and self._pending < self.max_queue

    def submit(
        self, messages: Sequence[ChatMessage], options: GenerationOptions, prompt: Sequence[int] | None = None
    ) -> Job:
        """Queue a generation (of `prompt`, the tokenized chat, when given). Raises `QueueFull` when the server is at
        its limit or shutting down. The check and the queueing are one synchronous step on the event loop, so two
        requests can never both take the last place."""
        if self._closed or self._pending >= self.max_queue:
            self.stats.rejected += 1
            reason = "the server is shutting down" if self._closed else f"{self._pending} generations are queued"
            raise QueueFull(f"Server busy: {reason}; retry later")
        if self._worker is None:
            self._worker = asyncio.create_task(self._run(), name="dlm-scheduler-worker")
        job = Job(messages=tuple(messages), options=options, prompt=None if prompt is None else tuple(prompt))
        self._pending += 1
        self._idle.clear()
        self.stats.submitted += 1
        self._queue.put_nowait(job)
        return job

    async def close(self, timeout_s: float = 10.0) -> None:
        """Refuse new jobs, cancel queued and running ones, and wait (bounded) for the running pass to end."""
        self._closed = True
        while not self._queue.empty():
            job = self._queue.get_nowait()
            job.cancel.set()
            self._finish(job)
        for job in self._running:
            job.cancel.set()
        with contextlib.suppress(TimeoutError):  # the model stops within one pass; do not hang on a stuck one
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._threads.shutdown(wait=False)

    async def _run(self) -> None:
        slots = asyncio.Semaphore(self.concurrency)
        try:
            while True:
                job = await self._queue.get()
                if job.cancel.is_set():
                    self._finish(job)
                    continue
                try:
                    await slots.acquire()
                except asyncio.CancelledError:  # shutdown while this job waited for a place: end its stream too
                    job.cancel.set()
                    self._finish(job)
                    raise
                self._running.add(job)
                task = asyncio.create_task(self._run_job(job, slots), name="dlm-scheduler-job")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except asyncio.CancelledError:
            for job in self._running:
                job.cancel.set()  # shutdown: the threads stop within one pass
            raise

    async def _run_job(self, job: Job, slots: asyncio.Semaphore) -> None:
        try:
            await relay_drafts(
                lambda: self._open(job), lambda _, draft: self._hand(job, draft), job.cancel,
                executor=self._threads, observe=self._on_draft,
            )
        except ModelError as error:
            job.error = error
        except Exception as error:
            # The model's own bugs must end this request with a clear message, never the worker (and the server).
            log.exception("generation failed")
            job.error = GenerationCrashed(f"generation failed: {type(error).__name__}: {error}")
        finally:
            self._running.discard(job)
            slots.release()
            self._finish(job)

    def _finish(self, job: Job) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._idle.set()
        if isinstance(job.error, GenerationCrashed):
            self.stats.failed += 1
        elif job.error is not None:
            self.stats.refused += 1
        elif job.finished:
            self.stats.completed += 1
        else:
            self.stats.cancelled += 1
        job.drafts.put_nowait(None)

    def _open(self, job: Job) -> Iterator[Draft]:
        """Worker thread: start the job's drafts, from its prompt when the request handler already tokenized it."""
        if job.prompt is not None and isinstance(self.model, TokenizingChatModel):
            return self.model.stream_prompt(job.prompt, job.options, job.cancel)
        return self.model.stream_chat(job.messages, job.options, job.cancel)

    @staticmethod
    def _hand(job: Job, draft: Draft) -> None:
        job.drafts.put_nowait(draft)
        if draft.done:
            job.finished = draft.finish_reason != "cancelled"
