"""The listening stage: PCM in; SpeechStart, SpeechEnd and Transcript events out, with honest monotonic timestamps.

A thin async shell over the no-I/O cores (`SileroVad`, `Endpointer`, `StreamingTranscriber`). Two kinds of blocking
work run in threads via `asyncio.to_thread`, so neither waits for the other:
- VAD + endpointing of each chunk (well under a millisecond per 32 ms window), awaited by `accept`, so speech_end is
  decided as soon as its last silent window arrives, however busy the recogniser is;
- Whisper decodes, at most one in flight per stage, under the process-wide model lock (one model per process, shared).
  When a decode finishes, audio that arrived meanwhile is decoded next, so a slow CPU gets fewer, larger partials;
  while other sessions hold or wait for the model, partials are spaced out by their number.
  A segment's final decode (and the likely final at silence onset) takes the lock ahead of other sessions' partials.

A segment's end reuses work: once the trailing silence reaches the padding, the padded utterance is decoded at once,
while the endpointer is still waiting out its minimum silence; `finish` then finds nothing new and returns that decode.
That decode goes out as soon as it is done, as a partial marked `likely_final` (the session starts the answer on it);
a voice that comes back in the same segment afterwards is reported (`VoiceResumed`), so that answer can be dropped.
`SpeechEnd.t_ns` is the arrival time of the last voiced sample (pass `arrival_ns` to `accept` when chunks were queued).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from model.process import watch
from model.spare_cores import SpareCores
from voice.audio import TARGET_RATE, StreamResampler, check_sample_rate, pcm16_to_float32
from voice.errors import VoiceError
from voice.events import Emit, NoWords, SpeechEnd, SpeechStart, Transcript, VoiceResumed, now_ns
from voice.listen.asr_models import LoadedModel, load_model
from voice.listen.endpointer import EndpointDecision, Endpointer, EndpointerConfig
from voice.listen.transcriber import Hypothesis, StreamingTranscriber, TranscriberConfig
from voice.listen.vad import SileroVad

# A voiced window below this speech probability is the voice fading: in held-out prompts the last 1-4 windows before
# the end of speech fall from ~0.95 through 0.4-0.7. A partial started then is still decoding when the likely final
# (the decode the answer waits for) is due ~64 ms after the last voiced window, and the likely final waits behind it.
FADING_PROBABILITY = 0.7


@dataclass(frozen=True, slots=True)
class ListenConfig:
    """Everything the listening stage can be tuned by; `model` is the `--asr-model` value (None: tiny.en)."""

    endpointer: EndpointerConfig = field(default_factory=EndpointerConfig)
    transcriber: TranscriberConfig = field(default_factory=TranscriberConfig)
    model: str | None = None
    cpu_threads: int = 0
    # Audio Whisper hears before the first voiced window: Silero opens speech late on soft onsets (a plosive's
    # closure, a breathy "w"), so the endpointer's 160 ms padding can clip a segment's first sound.
    lead_in_ms: int = 300


class ListenStage:
    """One session's ears. Call `accept` with each PCM16 chunk, `flush` at end of stream; events are awaited on `emit`.

    The stage knows speech *segments*, not turns: a segment is one stretch of speech the endpointer opened and
    closed. Which user turn a segment belongs to (a turn may span several, when the user pauses and goes on) is the
    turn-taking machine's decision: the session re-tags the `turn` field of the events it forwards. Here that field
    carries the segment's number, `segment`.

    Emits, per segment: `SpeechStart`, zero or more partial `Transcript(final=False)` (only when the text changed; a
    likely final always, each followed by `VoiceResumed` if the speech goes on) or `NoWords` (a decode heard none),
    `SpeechEnd`, then exactly one `Transcript(final=True)` (its `text` may be empty if Whisper heard no words); then
    `segment` advances. Await `accept` calls one at a time: the final decode runs inside the `accept` that ends the
    segment.
    Errors are raised, never swallowed: `AudioFormatError` from `accept` for a bad chunk (dropped; the stream goes
    on), `ASRError` from the `accept`/`flush` that ends a segment whose decode failed (that segment has no final).
    """

    def __init__(self, session: str, emit: Emit, config: ListenConfig | None = None,
                 model: LoadedModel | None = None, first_segment: int = 1,
                 on_likely_final: Callable[[np.ndarray, int], None] | None = None) -> None:
        self.session = session
        self.config = config or ListenConfig()
        self.segment = first_segment
        self._emit = emit
        self._model = model or load_model(self.config.model, self.config.cpu_threads)
        self._vad = SileroVad()
        self._endpointer = Endpointer(self.config.endpointer)
        self._transcriber = StreamingTranscriber(self._model.model, self.config.transcriber)
        self._resampler: StreamResampler | None = None
        self._lead_in = self._keep = 0
        self.retune(self.config)
        self._history = np.zeros(0, dtype=np.float32)
        self._history_start = 0  # stream sample index of _history[0]
        self._received = 0  # 16 kHz samples received this stream
        self._chunk_ends: list[int] = []  # stream sample index one past each chunk ...
        self._chunk_arrivals: list[int] = []  # ... and when that chunk arrived (monotonic ns)
        self._in_segment = False
        self._fed_to = 0  # stream sample index up to which the transcriber has been given audio
        self._pending: list[np.ndarray] = []  # fed audio not yet handed to the decode thread
        self._decoded_from = 0  # stream sample index the latest started decode reached
        self._decode_task: asyncio.Task[None] | None = None
        self._decode_error: VoiceError | None = None
        self._last_partial_text = ""  # partials are emitted only when their text changes (never empty ones)
        self._likely_voiced_end: int | None = None  # the voiced end a likely final went out for, until speech resumes
        self._segment_audio: list[np.ndarray] = []  # the padded audio of the current segment, as fed to Whisper
        self.last_segment_audio = np.zeros(0, dtype=np.float32)  # ... of the segment that ended last (turn detector)
        # called with the segment's padded audio and when its last voiced sample arrived, as its likely final decode
        # starts (the session's turn detector, and the turn's timing if its answer goes out before the segment ends)
        self.on_likely_final = on_likely_final

    def retune(self, config: ListenConfig) -> None:
        """Listen by `config`'s endpointer and lead-in from the next window on (a client's tuning of its session:
        voice/turn/tuning.py); the model and the transcriber stay as they are."""
        self.config = config
        self._endpointer.config = ep = config.endpointer
        # Audio kept while idle: a speech_start reaches back min_speech + padding (+ one window of slack).
        self._lead_in = ep.samples(max(ep.speech_pad_ms, config.lead_in_ms))
        self._keep = ep.samples(ep.min_speech_ms) + self._lead_in + 2 * ep.frame_samples

    # --- input ---------------------------------------------------------------------------------------------------
    async def accept(self, pcm: bytes, sample_rate: int = TARGET_RATE, arrival_ns: int | None = None) -> None:
        """Take one chunk of PCM16 LE mono audio. Raises `AudioFormatError` for odd-length or wrong-rate input
        (the chunk is dropped; the stream goes on)."""
        arrival = now_ns() if arrival_ns is None else arrival_ns
        samples = pcm16_to_float32(pcm)
        rate = check_sample_rate(sample_rate)
        if self._resampler is None or self._resampler.from_rate != rate:
            self._resampler = StreamResampler(rate)
        await self._accept_16k(self._resampler.push(samples), arrival)

    @property
    def speech_start_ms(self) -> float:
        """The current (or last) segment's first voiced sample, in ms of audio since the stream began."""
        return self._endpointer.speech_start * 1000 / TARGET_RATE

    @property
    def speech_end_ms(self) -> float:
        """One past the current (or last) segment's last voiced sample, in ms of audio since the stream began."""
        return self._endpointer.last_voiced_end * 1000 / TARGET_RATE

    @property
    def silence_ms(self) -> float:
        """Milliseconds of audio since the last voiced sample, on the stream's own clock: 0 while the newest VAD window
        is voiced, then growing, inside the open segment (whose end the endpointer decides at `min_silence_ms`) as
        after it."""
        ep = self._endpointer
        if ep.speaking:
            return (ep.position - ep.last_voiced_end) * 1000 / TARGET_RATE
        return max(0, self._received - ep.last_voiced_end) * 1000 / TARGET_RATE

    async def flush(self) -> None:
        """End of stream: close a segment still open (no trailing silence needed) and wait for its final transcript."""
        if self._resampler is not None:
            tail = self._resampler.push(np.zeros(0, dtype=np.float32), last=True)
            self._resampler = None
            if tail.size:
                await self._accept_16k(tail, now_ns())
        decision = self._endpointer.finish()
        if decision is not None:
            await self._end_segment(decision)

    async def wait_for_decodes(self) -> None:
        """Wait until no decode is in flight, including those a finished decode chains. A caller that feeds faster
        than real time then sees the partials a real-time stream on a fast CPU would see, whatever this CPU's speed."""
        while self._decode_task is not None:
            await asyncio.shield(self._decode_task)

    async def aclose(self) -> None:
        """Stop background decoding (e.g. the session closed mid-segment) and wait for it to stop."""
        task, self._decode_task = self._decode_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # --- internals -----------------------------------------------------------------------------------------------
    async def _accept_16k(self, samples: np.ndarray, arrival: int) -> None:
        if samples.size == 0:
            return
        self._history = np.concatenate([self._history, samples])
        self._received += samples.size
        self._chunk_ends.append(self._received)
        self._chunk_arrivals.append(arrival)
        probabilities = await asyncio.to_thread(self._vad.push, samples)
        failure: VoiceError | None = None
        for probability in probabilities:
            # every window reaches the endpointer even after a failed segment, or its sample count would drift
            decision = self._endpointer.push(probability)
            try:
                if decision is not None and decision.kind == "speech_start":
                    await self._start_segment(decision)
                elif decision is not None:
                    await self._end_segment(decision)
            except VoiceError as err:
                failure = failure or err
        if self._in_segment:
            resumed = self._likely_voiced_end
            if resumed is not None and self._endpointer.last_voiced_end > resumed:
                self._likely_voiced_end = None  # the likely final sent out is not this segment's final any more
                await self._emit(VoiceResumed(session=self.session, turn=self.segment, t_ns=arrival))
            self._feed(self._feed_target())
            self._maybe_decode()
        self._forget_old_audio()
        if failure is not None:
            raise failure

    async def _start_segment(self, decision: EndpointDecision) -> None:
        self._in_segment = True
        self._transcriber.reset()
        self._fed_to = self._decoded_from = max(decision.sample - self._lead_in, self._history_start)
        self._pending = []
        self._segment_audio = []
        self._last_partial_text = ""
        self._likely_voiced_end = None
        await self._emit(SpeechStart(session=self.session, turn=self.segment, t_ns=self._arrival_of(decision.sample)))

    async def _end_segment(self, decision: EndpointDecision) -> None:
        """Emit SpeechEnd, then the final transcript. A failed decode raises its `ASRError` here, after the segment's
        state is cleared, so the caller can report it and the next segment starts clean."""
        detected = now_ns()
        self._feed(decision.audio_to)
        self._in_segment = False
        self._likely_voiced_end = None
        segment, self._segment_audio = self._segment_audio, []
        self.last_segment_audio = np.concatenate(segment) if segment else np.zeros(0, dtype=np.float32)
        last_voiced = self._arrival_of(max(decision.sample - 1, 0))
        await self._emit(SpeechEnd(session=self.session, turn=self.segment, t_ns=last_voiced, detected_ns=detected))
        try:
            if self._decode_task is not None:
                await self._decode_task
            if self._decode_error is not None:
                raise self._decode_error
            chunks, self._pending = self._pending, []
            final = await asyncio.to_thread(self._locked_finish, chunks)
            await self._emit(Transcript(session=self.session, turn=self.segment, text=final.text,
                                        committed=final.committed, final=True))
        finally:
            self._decode_error = None
            self._pending = []
            self._transcriber.reset()
            self.segment += 1

    def _feed_target(self) -> int:
        """Feed everything while voiced; in trailing silence only up to the padded end, so that silence the
        endpointer will cut never reaches Whisper (and the decode made during the silence is the final one)."""
        return min(self._received, self._padded_end(self._endpointer.last_voiced_end))

    def _padded_end(self, voiced_end: int) -> int:
        """Where a segment whose speech ends at `voiced_end` stops reaching Whisper: its likely final is decoded once
        the audio is fed that far."""
        return voiced_end + self._endpointer.config.samples(self._endpointer.config.speech_pad_ms)

    def _feed(self, target: int) -> None:
        start = max(self._fed_to, self._history_start)
        if target > start:
            chunk = self._history[start - self._history_start:target - self._history_start].copy()
            self._pending.append(chunk)
            self._segment_audio.append(chunk)
            self._fed_to = target

    def _maybe_decode(self) -> None:
        if self._decode_task is not None or self._decode_error is not None or self._fed_to <= self._decoded_from:
            return
        step = int(self.config.transcriber.partial_step_s * TARGET_RATE)
        # Until the segment's first words, look twice as often: a barge-in waits for them (a sound over the answer
        # pauses it, words clear it), and the first look, at the segment's start, often hears none yet. Over open
        # speakers the echo canceller holds a voice that starts over the answer down for its first 100-300 ms, while
        # it tells the voice from the echo: at the usual step the words came a look later, past 1 s.
        look = step if self._last_partial_text else step // 2
        ep = self._endpointer
        if self._received - ep.last_voiced_end >= ep.config.frame_samples:
            # Trailing silence: no partials of silence; decode once the padded end is in (the likely final).
            due = self._fed_to >= self._padded_end(ep.last_voiced_end)
        else:
            # Partials only show the words so far, and a final decode waits behind the partial in flight: while
            # other sessions decode or wait for the shared model, each session's partials come that much less often,
            # and none starts while the voice fades (the likely final may be a window away) unless one is long due.
            lock, fresh = self._model.lock, self._fed_to - self._decoded_from
            due = fresh >= look * (1 + lock.waiting + lock.locked())
            due = due and (ep.last_probability >= FADING_PROBABILITY or fresh >= 2 * step)
        if due:
            self._decode_task = asyncio.create_task(self._decode_once(), name=f"asr-decode-{self.session}")

    async def _decode_once(self) -> None:
        try:
            chunks, self._pending = self._pending, []
            self._decoded_from = through = self._fed_to  # the audio this decode hears ends there
            segment = self.segment
            ep = self._endpointer
            voiced_end = ep.last_voiced_end
            likely_final = self._fed_to >= self._padded_end(voiced_end)
            if likely_final and self.on_likely_final is not None and self._in_segment:
                self.on_likely_final(np.concatenate(self._segment_audio), self._arrival_of(max(voiced_end - 1, 0)))
            partial = await asyncio.to_thread(self._locked_process, chunks, likely_final)
            current = partial is not None and self._in_segment and segment == self.segment
            # a likely final counts only if no speech came while it was decoded (else the next decode follows)
            likely = current and likely_final and ep.last_voiced_end == voiced_end
            if partial is not None and current and not partial.text:
                through_ms = through * 1000 / TARGET_RATE
                await self._emit(NoWords(session=self.session, turn=self.segment, through_ms=through_ms))
            elif partial is not None and current and (likely or partial.text != self._last_partial_text):
                self._last_partial_text = partial.text
                if likely:
                    self._likely_voiced_end = voiced_end
                await self._emit(Transcript(session=self.session, turn=self.segment, text=partial.text,
                                            committed=partial.committed, final=False, likely_final=likely))
        except VoiceError as err:
            self._decode_error = err  # raised from the end of the segment; no more partials for it
            return
        finally:
            self._decode_task = None
        if self._in_segment:
            self._maybe_decode()

    def _locked_process(self, chunks: list[np.ndarray], likely_final: bool) -> Hypothesis | None:
        # the likely final (the decode at silence onset) is what the answer waits for: ahead of others' partials
        kind = watch.ASR_LIKELY_FINAL if likely_final else watch.ASR_PARTIAL
        with watch.span(kind), self._model.lock.urgently() if likely_final else self._model.lock:
            for chunk in chunks:
                self._transcriber.insert_audio(chunk)
            # the likely final's cores are the answer's first passes', which follow it (model/spare_cores.py)
            with SpareCores.handing_over(self._model.threads) if likely_final else contextlib.nullcontext():
                return self._transcriber.process(force=True, as_final=likely_final)

    def _locked_finish(self, chunks: list[np.ndarray]) -> Hypothesis:
        with watch.span(watch.ASR_FINAL), self._model.lock.urgently():
            for chunk in chunks:
                self._transcriber.insert_audio(chunk)
            return self._transcriber.finish()

    def _arrival_of(self, sample: int) -> int:
        """When the chunk holding stream sample `sample` arrived."""
        index = bisect.bisect_right(self._chunk_ends, sample)
        return self._chunk_arrivals[min(index, len(self._chunk_arrivals) - 1)]

    def _forget_old_audio(self) -> None:
        keep_from = self._fed_to if self._in_segment else self._received - self._keep
        drop = keep_from - self._history_start
        if drop > 0:
            self._history = self._history[drop:]
            self._history_start = keep_from
        # chunk times are needed back to the oldest sample a decision may still name
        oldest = self._history_start - self._keep
        if self._in_segment:
            oldest = min(oldest, self._endpointer.speech_start)
        cut = bisect.bisect_right(self._chunk_ends, oldest)
        if cut > 1:
            del self._chunk_ends[:cut - 1]
            del self._chunk_arrivals[:cut - 1]
