"""The speaking stage: drafts of one answer in, committed audio out, with speculative rendering in between.

A thin async shell around `PhraseSpeculator`. Speculative renders run in a worker thread, one at a time, pulled one
chunk per thread call so a cancel lands between chunks. On `Commit` a started render with the same text is released at
once (hit); any other render is dropped and the committed text rendered first (miss, or none when nothing was
speculated). Audio leaves in phrase order and only for committed phrases.

Events emitted (through the `emit` coroutine): PhraseCommitted, SpeculationResult (at a phrase's first released audio,
when its saving is known), TtsFirstChunk (stamped when the first released phrase's first chunk was synthesised),
AudioStart, AudioOut, AudioEnd. `FirstAudioOut` belongs to the output side, which also reports playback to the
`PlaybackLedger`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from model.chat import Draft
from voice.events import (
    AudioEnd,
    AudioOut,
    AudioStart,
    Emit,
    PhraseCommitted,
    SpeculationResult,
    TtsFirstChunk,
    now_ns,
)
from voice.speak.playback_ledger import PlaybackLedger
from voice.speak.speculator import Action, Commit, Discard, PhraseSpeculator, Render, SpeculatorConfig
from voice.speak.tts import SpeechSynthesizer

# The longest the first phrase's synthesis holds the language model's passes: Piper's first chunk of a short phrase
# takes ~60 ms on both cores of the 2-core machine (a `lead` synthesis, scripts/bench/bench_tts.py), ~110 ms a turn
# in the session (tts_first_chunk in scripts/heard_latency.py).
FIRST_AUDIO_HOLD_S = 0.3


@dataclass(slots=True)
class _Render:
    phrase_id: int
    text: str
    committed: bool
    cancel: threading.Event = field(default_factory=threading.Event)
    chunks: list[bytes] = field(default_factory=list)
    started_ns: int = 0
    first_chunk_ns: int = 0
    finished: bool = False
    wall_ns: int = 0  # time spent in synthesis calls
    cpu_ns: int = 0  # CPU time of the synthesis thread
    chunk_source: Iterator[bytes] | None = None  # the synthesis in progress (kept while the render is suspended)


@dataclass(slots=True)
class _Phrase:
    phrase_id: int
    text: str
    committed_ns: int
    render: _Render
    outcome: str
    released: int = 0  # chunks handed out


@dataclass(frozen=True, slots=True)
class SpeakReport:
    """What one answer's speech cost and saved. `wasted_*` counts renders that were discarded (never played)."""

    phrases: tuple[str, ...]
    hits: int
    misses: int
    nones: int
    saved_ms: float
    wasted_ms: float
    wasted_cpu_ms: float
    render_cpu_ms: float
    samples_out: int
    commit_to_audio_ms: tuple[float, ...]  # per phrase: commit -> its first chunk handed out (0 for silent phrases)


def _next_chunk(chunks: Iterator[bytes]) -> tuple[bytes | None, int]:
    start = time.thread_time_ns()
    chunk = next(chunks, None)
    return chunk, time.thread_time_ns() - start


class SpeakStage:
    """Speaks one answer. Create one per answer; `run` consumes its drafts and returns when all audio is handed out.

    `first_audio_hold`, when given, is held while the answer's first phrase is synthesised up to its first chunk: the
    language model's passes stand aside (`DiffusionChatModel.standing_aside`, for at most `FIRST_AUDIO_HOLD_S`), since
    that chunk is what the user is waiting to hear and the rest of the answer is far ahead of playback anyway. That
    phrase is then a `lead` synthesis, which may use the cores the passes left."""

    def __init__(
        self,
        synthesizer: SpeechSynthesizer,
        emit: Emit,
        *,
        session: str,
        turn: int,
        config: SpeculatorConfig | None = None,
        ledger: PlaybackLedger | None = None,
        first_audio_hold: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        self._synthesizer = synthesizer
        self._first_audio_hold = first_audio_hold
        self._emit = emit
        self._session = session
        self._turn = turn
        self._speculator = PhraseSpeculator(config if config is not None else SpeculatorConfig())
        self.ledger = ledger if ledger is not None else PlaybackLedger()
        self._speculative: dict[int, _Render] = {}
        self._discarded: list[_Render] = []
        self._speculated_ids: set[int] = set()  # phrases that got a speculative render at some point
        self._queue: list[_Render] = []
        self._phrases: list[_Phrase] = []
        self._all_renders: list[_Render] = []
        self._feeding_done = False
        self._worker_wake = asyncio.Event()
        self._output_wake = asyncio.Event()
        self._audio_started = False
        self._commit_to_audio_ms: list[float] = []
        self._saved_ms = 0.0
        self._ran = False

    @property
    def sample_rate(self) -> int:
        return self._synthesizer.sample_rate

    async def run(self, drafts: asyncio.Queue[Draft | None]) -> SpeakReport:
        """Speak the answer whose drafts arrive on `drafts`, a queue ended by a done draft or `None` (the producer
        puts `None` when it stops early, e.g. on a model error). Cancelling the task stops rendering between chunks
        and waits for the chunk in flight, so no work is left behind. A single failure (a `TTSError` from synthesis)
        is raised as itself, not wrapped in an exception group."""
        if self._ran:
            raise RuntimeError("a SpeakStage speaks one answer; create a new one")
        self._ran = True
        name = f"{self._session}/{self._turn}"
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._render_loop(), name=f"tts-render-{name}")
                group.create_task(self._release_loop(), name=f"tts-release-{name}")
                await self._consume(drafts)
        except BaseExceptionGroup as failures:
            first = failures.exceptions[0]
            if len(failures.exceptions) == 1 and isinstance(first, Exception):
                raise first from None
            raise
        return self._report()

    # --- drafts -> actions -----------------------------------------------------------------------------------------
    async def _consume(self, drafts: asyncio.Queue[Draft | None]) -> None:
        try:
            while (draft := await drafts.get()) is not None:
                await self._apply(self._speculator.feed(draft))
                if draft.done:
                    break
            await self._apply(self._speculator.finish())
        finally:
            self._feeding_done = True
            self._worker_wake.set()
            self._output_wake.set()

    async def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Render):
                render = _Render(action.phrase_id, action.text, committed=False)
                self._speculative[action.phrase_id] = render
                self._speculated_ids.add(action.phrase_id)
                self._enqueue(render)
            elif isinstance(action, Discard):
                self._drop(self._speculative.pop(action.phrase_id, None))
            elif isinstance(action, Commit):
                await self._commit(action)

    async def _commit(self, action: Commit) -> None:
        committed_ns = now_ns()
        self.ledger.begin_phrase(action.phrase_id, action.text)
        render = self._speculative.pop(action.phrase_id, None)
        # The outcome judges the speculation, not the timing: a matching render still waiting in the queue is a hit
        # whose `saved_ms` is 0; a wrong render is a miss even if it was dropped before it started.
        if render is not None and render.text == action.text:
            outcome = "hit"
        else:
            self._drop(render)
            outcome = "miss" if action.phrase_id in self._speculated_ids else "none"
            render = _Render(action.phrase_id, action.text, committed=True)
            self._enqueue(render)
        render.committed = True
        self._worker_wake.set()
        # The render may start while the event goes out; its audio may not, so the phrase joins the release list
        # only once PhraseCommitted has been emitted.
        await self._emit(PhraseCommitted(session=self._session, turn=self._turn, phrase_id=action.phrase_id,
                                         text=action.text, t_ns=committed_ns))
        self._phrases.append(_Phrase(action.phrase_id, action.text, committed_ns, render, outcome))
        self._output_wake.set()

    def _enqueue(self, render: _Render) -> None:
        self._queue.append(render)
        self._all_renders.append(render)
        self._worker_wake.set()

    def _drop(self, render: _Render | None) -> None:
        if render is None:
            return
        render.cancel.set()
        if render in self._queue:
            self._queue.remove(render)
            if render.chunk_source is not None:  # suspended, not running: nobody else will close its synthesis
                self._close(render)
        if render.started_ns:
            self._discarded.append(render)

    # --- rendering (one at a time, in a worker thread) --------------------------------------------------------------
    def _next_render(self) -> _Render | None:
        if not self._queue:
            return None
        # Committed phrases first (someone is waiting for them), then the earliest speculative phrase.
        render = min(self._queue, key=lambda r: (not r.committed, r.phrase_id))
        self._queue.remove(render)
        return render

    async def _render_loop(self) -> None:
        while True:
            render = self._next_render()
            if render is None:
                if self._feeding_done:
                    return
                self._worker_wake.clear()
                await self._worker_wake.wait()
                continue
            await self._render(render)

    async def _render(self, render: _Render) -> None:
        """Synthesise `render` chunk by chunk. A speculative render steps aside (suspended between chunks, back in
        the queue with its synthesis kept) as soon as a committed phrase waits: someone is listening for that one."""
        if render.chunk_source is None:
            render.started_ns = now_ns()
            # rendered while the LM stands aside: the committed first phrase only. A speculative render of it shares
            # the cores with the passes, which must go on to commit the phrase before its audio may leave: when the
            # passes stood aside for the drafted first phrase, it committed 300-800 ms later (AVX2 EPYC, 30 held-out
            # turns: p50 384 ms against 47 without drafts) and voice-to-voice p50 rose 858 -> 1,110 ms
            lead = render.phrase_id == 0 and render.committed and self._first_audio_hold is not None
            render.chunk_source = self._synthesizer.synthesize(render.text, render.cancel, lead=lead)
        chunks = render.chunk_source
        try:
            while not render.cancel.is_set():
                if not render.committed and any(waiting.committed for waiting in self._queue):
                    self._queue.append(render)
                    return
                started = time.perf_counter_ns()
                first = render.phrase_id == 0 and render.committed and not render.chunks
                hold = self._first_audio_hold if first else None
                with hold() if hold is not None else nullcontext():
                    chunk, cpu_ns = await self._pull(chunks)
                render.wall_ns += time.perf_counter_ns() - started
                render.cpu_ns += cpu_ns
                if chunk is None:
                    break
                if not render.chunks:
                    render.first_chunk_ns = now_ns()
                render.chunks.append(chunk)
                self._output_wake.set()
        except BaseException:
            self._close(render)
            raise
        self._close(render)

    def _close(self, render: _Render) -> None:
        if isinstance(render.chunk_source, Generator):  # a synthesis stopped early frees its Piper stream now
            render.chunk_source.close()
        render.finished = True
        self._output_wake.set()

    async def _pull(self, chunks: Iterator[bytes]) -> tuple[bytes | None, int]:
        """The next chunk, computed in a thread. If cancelled meanwhile, wait for that chunk to finish first: the
        thread cannot be interrupted, and the stage must leave no synthesis running after it ends."""
        future = asyncio.get_running_loop().run_in_executor(None, _next_chunk, chunks)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait({future})
            if not future.cancelled():
                future.exception()  # retrieved so it is not logged; the cancel wins
            raise

    # --- committed audio out, in phrase order ------------------------------------------------------------------------
    async def _release_loop(self) -> None:
        index = 0
        while True:
            if index < len(self._phrases):
                phrase = self._phrases[index]
                render = phrase.render
                if phrase.released < len(render.chunks):
                    await self._release_chunk(phrase)
                    continue
                if render.finished:
                    if phrase.released == 0:
                        await self._speculation_result(phrase)
                    self.ledger.end_phrase(phrase.phrase_id)
                    index += 1
                    continue
            elif self._feeding_done:
                break
            self._output_wake.clear()
            await self._output_wake.wait()
        if self._audio_started:
            await self._emit(AudioEnd(session=self._session, turn=self._turn))

    async def _release_chunk(self, phrase: _Phrase) -> None:
        render = phrase.render
        chunk = render.chunks[phrase.released]
        if phrase.released == 0:
            await self._speculation_result(phrase)
            if not self._audio_started:
                self._audio_started = True
                await self._emit(TtsFirstChunk(session=self._session, turn=self._turn, t_ns=render.first_chunk_ns))
                await self._emit(AudioStart(session=self._session, turn=self._turn, sample_rate=self.sample_rate))
        phrase.released += 1
        self.ledger.add_audio(phrase.phrase_id, len(chunk) // 2)
        await self._emit(AudioOut(session=self._session, turn=self._turn, pcm=chunk, sample_rate=self.sample_rate,
                                  phrase_id=phrase.phrase_id))

    async def _speculation_result(self, phrase: _Phrase) -> None:
        render = phrase.render
        released_ns = now_ns()
        saved_ms = 0.0
        if phrase.outcome == "hit":
            ready_ns = render.first_chunk_ns or released_ns
            synthesis_ms = (ready_ns - render.started_ns) / 1e6
            waited_ms = max(0.0, (ready_ns - phrase.committed_ns) / 1e6)
            saved_ms = max(0.0, synthesis_ms - waited_ms)
        self._saved_ms += saved_ms
        self._commit_to_audio_ms.append((released_ns - phrase.committed_ns) / 1e6 if render.chunks else 0.0)
        wasted_ms = sum(r.wall_ns for r in self._discarded if r.phrase_id == phrase.phrase_id) / 1e6
        await self._emit(SpeculationResult(session=self._session, turn=self._turn, phrase_id=phrase.phrase_id,
                                           outcome=phrase.outcome, saved_ms=saved_ms, wasted_ms=wasted_ms))

    def _report(self) -> SpeakReport:
        used = {id(phrase.render) for phrase in self._phrases}
        wasted = [r for r in self._all_renders if id(r) not in used and r.started_ns]
        outcomes = [phrase.outcome for phrase in self._phrases]
        return SpeakReport(
            phrases=tuple(phrase.text for phrase in self._phrases),
            hits=outcomes.count("hit"),
            misses=outcomes.count("miss"),
            nones=outcomes.count("none"),
            saved_ms=self._saved_ms,
            wasted_ms=sum(r.wall_ns for r in wasted) / 1e6,
            wasted_cpu_ms=sum(r.cpu_ns for r in wasted) / 1e6,
            render_cpu_ms=sum(r.cpu_ns for r in self._all_renders) / 1e6,
            samples_out=self.ledger.samples_out(),
            commit_to_audio_ms=tuple(self._commit_to_audio_ms),
        )
