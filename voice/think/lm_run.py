"""The language model's side of a turn: one answer generated in a worker thread, drafts handed to the event loop.

Blocking model work never runs on the event loop. Cancellation is cooperative: the sampler checks the cancel flag
between denoising passes, so a cancelled answer stops within one pass and releases the model for the next turn.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

from model.chat import ChatMessage, ChatModel, Draft, GenerationOptions
from model.chat.draft_relay import relay_drafts
from model.errors import ModelError
from voice.cancellation import cancel_and_wait
from voice.events import now_ns

log = logging.getLogger(__name__)


class LmRun:
    """One answer being generated in a worker thread; drafts arrive on `queue` as `(t_ns, Draft)`.

    The thread (`model.chat.draft_relay`) pulls the model's draft iterator to the end (or until `cancel` is set,
    checked by the sampler between passes) and closes it itself, so the model's lock is always released by the thread
    that holds the iterator.
    """

    def __init__(self, lm: ChatModel, messages: list[ChatMessage], options: GenerationOptions, name: str) -> None:
        self.started_ns = now_ns()
        self.cancel = threading.Event()
        self.queue: asyncio.Queue[tuple[int, Draft] | BaseException | None] = asyncio.Queue()
        self._future = relay_drafts(lambda: lm.stream_chat(messages, options, self.cancel), self._hand, self.cancel)
        self._future.add_done_callback(self._ended)
        self.task = asyncio.create_task(self._watch(), name=name)

    def _hand(self, t_ns: int, draft: Draft) -> None:
        self.queue.put_nowait((t_ns, draft))

    def _ended(self, future: asyncio.Future[None]) -> None:
        """The thread has let go of the model: its error, if any, then the end of the drafts, whoever still reads."""
        error = None if future.cancelled() else future.exception()
        if isinstance(error, ModelError):
            self.queue.put_nowait(error)
        elif isinstance(error, Exception):  # a model bug must end this turn with a clear error, not hang it
            log.error("language model failed", exc_info=error)
            self.queue.put_nowait(ModelError(f"the language model failed: {error}"))
        self.queue.put_nowait(None)

    async def _watch(self) -> None:
        """The run's task: done once the thread let go of the model. `asyncio.wait` neither raises the thread's
        error (`_ended` queues it for the reader) nor cancels the thread's future; cancelling the task stops the
        generation and waits (bounded) for the thread."""
        try:
            await asyncio.wait({self._future})
        except asyncio.CancelledError:
            self.stop()
            await asyncio.wait({self._future}, timeout=10)
            raise

    def stop(self) -> None:
        self.cancel.set()

    async def drafts(self) -> AsyncIterator[tuple[int, Draft]]:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
            if item[1].done:
                return

    async def close(self) -> None:
        """Stop the generation and wait (bounded) until its thread let go of the model. The caller's own
        cancellation propagates; the run's outcome stays on `task`."""
        self.stop()
        await cancel_and_wait(self.task)

