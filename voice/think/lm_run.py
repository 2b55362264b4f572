"""The language model's side of a turn: one answer generated in a worker thread, drafts handed to the event loop.

Blocking model work never runs on the event loop. Cancellation is cooperative: the sampler checks the cancel flag
between denoising passes, so a cancelled answer stops within one pass and releases the model for the next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator

from model.chat import ChatMessage, ChatModel, Draft, GenerationOptions
from model.errors import ModelError
from voice.cancellation import cancel_and_wait
from voice.events import now_ns

log = logging.getLogger(__name__)


class LmRun:
    """One answer being generated in a worker thread; drafts arrive on `queue` as `(t_ns, Draft)`.

    The thread pulls the model's draft iterator to the end (or until `cancel` is set, checked by the sampler between
    passes) and closes it itself, so the model's lock is always released by the thread that holds the iterator.
    """

    def __init__(self, lm: ChatModel, messages: list[ChatMessage], options: GenerationOptions, name: str) -> None:
        self.started_ns = now_ns()
        self.cancel = threading.Event()
        self.queue: asyncio.Queue[tuple[int, Draft] | BaseException | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._future = self._loop.run_in_executor(None, self._drive, lm, messages, options)
        self.task = asyncio.create_task(self._watch(), name=name)

    def _drive(self, lm: ChatModel, messages: list[ChatMessage], options: GenerationOptions) -> None:
        put = self.queue.put_nowait
        try:
            drafts = lm.stream_chat(messages, options, self.cancel)
            try:
                for draft in drafts:
                    self._loop.call_soon_threadsafe(put, (now_ns(), draft))
                    if draft.done or self.cancel.is_set():
                        break
            finally:
                drafts.close()  # type: ignore[attr-defined]
        except ModelError as err:
            self._loop.call_soon_threadsafe(put, err)
        except Exception as err:  # a model bug must end this turn with a clear error, not hang it
            log.exception("language model failed")
            self._loop.call_soon_threadsafe(put, ModelError(f"the language model failed: {err}"))
        finally:
            self._loop.call_soon_threadsafe(put, None)

    async def _watch(self) -> None:
        try:
            await asyncio.shield(self._future)
        except asyncio.CancelledError:
            self.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._future), timeout=10)
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

