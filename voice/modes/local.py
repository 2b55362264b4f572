"""Local mode: talk to the assistant through this machine's microphone and speakers (PortAudio via `sounddevice`).

The PortAudio callbacks run in audio threads: the microphone callback only copies its block onto the event loop, and
the speaker callback only copies queued PCM out and counts what it played, so nothing slow ever runs in an audio
thread. With open speakers (the default) the assistant's own voice is cancelled from the microphone (WebRTC's AEC3,
voice/listen/own_voice.py), so it listens all the time and you can talk over it without a headset; the reference is
what the speaker callback hands the device, placed on the microphone's clock by PortAudio's own timestamps (when each
speaker block reaches the DAC, when each microphone block left the ADC). With `--headset` it listens without
cancelling; with `--half-duplex` (and whenever the canceller cannot keep up or its alignment fails, with a line that
says so) the microphone is muted while the assistant's audio is still playing, so it cannot interrupt itself.

No underruns: the speaker stream keeps `OUTPUT_LATENCY_S` of audio queued in the device ahead of playback, so a
callback that runs late (the GIL, busy cores) still finds the device fed, and the audio threads ask for real-time
scheduling where they may. The size is measured, not guessed (scripts/bench/bench_local_mode.py, 10 turns per run,
PulseAudio over ALSA, the 2-core development machine shared at load 6-9): PortAudio's default "high" latency (35 ms)
underran 361 times (38 while the answer played), 100 ms 1 and 4 times in two runs, 150 ms 0, 1 and 0 times in three.
Stalls of 200-400 ms still happen when the machine is overloaded (200 ms underran 4 times at load 9), and most underruns
fall in silence, while the ASR and LM work: each turn's `TurnEnd.stats` carries the underflow flags (all, and those
while the answer was playing), the microphone's overflows and the longest gap between speaker callbacks, so a machine
that needs more shows it. ALSA's own error messages ("underrun occurred") go to the log at debug level instead of the
console (voice/modes/audio_devices.py, which also finds and checks the devices).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from voice.audio import TARGET_RATE
from voice.engines import Engines
from voice.errors import AudioFormatError
from voice.events import AnswerDone, AudioOut, AudioStart, Clear, ErrorEvent, Pause, Resume, Transcript, TurnEnd
from voice.listen.own_voice import ECHO_RATE, OwnVoice
from voice.modes import audio_devices
from voice.modes.audio_devices import check_devices, sounddevice_module
from voice.turn.session import Session, SessionConfig

log = logging.getLogger(__name__)

BLOCK_MS = 20
OUTPUT_LATENCY_S = 0.15  # audio queued in the device ahead of playback (see the module docstring for the measurement)
ECHO_TAIL_S = 0.3  # keep the microphone muted this long after the speaker went quiet (room echo)
# after this much of the assistant's voice, a canceller that took less than this off the microphone is not aligned
# with the speaker (a device whose clock PortAudio misreports): local mode falls back to half duplex and says so
ALIGNMENT_CHECK_S = 4.0
MIN_ERLE_DB = 3.0


@dataclass(frozen=True, slots=True)
class LocalAudioConfig:
    input_device: int | str | None = None
    output_device: int | str | None = None
    headset: bool = False  # listen while speaking without cancelling: the microphone does not hear the speaker
    half_duplex: bool = False  # open speakers without a canceller: the microphone is muted while the voice plays
    output_latency_s: float = OUTPUT_LATENCY_S

    @property
    def cancels_echo(self) -> bool:
        return not (self.headset or self.half_duplex)

    def __post_init__(self) -> None:
        if self.headset and self.half_duplex:
            raise ValueError("--headset listens while speaking and --half-duplex does not: choose one")
        if not 0.005 <= self.output_latency_s <= 2.0:
            raise ValueError(f"the output latency must be 5-2000 ms, got {self.output_latency_s * 1000:g} ms")


# --- the audio threads' side ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class StreamCounters:
    """What the PortAudio callbacks saw. Written only by the audio threads, read by the event loop."""

    output_underflows: int = 0
    audible_underflows: int = 0  # while the answer's audio was in the device: a gap or click the listener hears
    input_overflows: int = 0
    input_underflows: int = 0
    output_callbacks: int = 0
    input_callbacks: int = 0
    last_output_at: float = 0.0
    max_output_gap: float = 0.0
    _reported: dict[str, float] = field(default_factory=dict)

    def on_output(self, status: Any, now: float, sounding: bool) -> None:
        if not self.output_callbacks:
            boost_audio_thread()
        self.output_callbacks += 1
        if status.output_underflow:
            self.output_underflows += 1
            self.audible_underflows += sounding
        if self.last_output_at:
            self.max_output_gap = max(self.max_output_gap, now - self.last_output_at)
        self.last_output_at = now

    def on_input(self, status: Any) -> None:
        if not self.input_callbacks:
            boost_audio_thread()
        self.input_callbacks += 1
        if status.input_overflow:
            self.input_overflows += 1
        if status.input_underflow:
            self.input_underflows += 1

    def since_last_report(self) -> dict[str, float]:
        """The counts since the previous call (one turn's worth), plus the longest callback gap in ms."""
        now = {
            "output_underflows": float(self.output_underflows),
            "audible_underflows": float(self.audible_underflows),
            "input_overflows": float(self.input_overflows),
            "input_underflows": float(self.input_underflows),
        }
        delta = {name: value - self._reported.get(name, 0.0) for name, value in now.items()}
        self._reported = now
        delta["output_callback_gap_ms"] = self.max_output_gap * 1000
        self.max_output_gap = 0.0
        return delta


def boost_audio_thread() -> None:
    """Ask for real-time scheduling of the calling audio thread (allowed for root or with an rtprio limit, as audio
    groups set up); elsewhere it keeps its normal priority. On a loaded machine this keeps callbacks on time."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))  # 0: this thread (Linux schedules threads)


class SpeakerBuffer:
    """PCM waiting for the speaker; filled from the event loop, drained by the audio thread. While paused (the user
    made a sound that may be a barge-in) the speaker plays silence and the queued speech waits."""

    def __init__(self) -> None:
        self._chunks: deque[memoryview] = deque()
        self._lock = threading.Lock()
        self.played = 0  # samples of the current answer handed to the device
        self.last_audio_at = 0.0
        self.paused = False
        self.turn = 0  # the answer now playing
        # bumped at every stop, resume and new answer: a playback report from the audio thread that a stop overtook
        # on its way to the event loop is recognised as stale
        self.generation = 0

    def push(self, pcm: bytes) -> None:
        with self._lock:
            self._chunks.append(memoryview(pcm))

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self.paused = False
            self.generation += 1

    def pause(self, paused: bool) -> None:
        with self._lock:
            self.paused = paused
            self.generation += 1

    def new_answer(self, turn: int) -> None:
        with self._lock:
            self.played = 0
            self.turn = turn
            self.generation += 1

    def sounding(self, now: float, device_latency_s: float) -> bool:
        """Answer audio is queued here or still playing out of the device."""
        with self._lock:
            return bool(self._chunks) or now - self.last_audio_at < device_latency_s

    def busy(self, now: float) -> bool:
        with self._lock:
            return bool(self._chunks) or now - self.last_audio_at < ECHO_TAIL_S

    def fill(self, out: memoryview, now: float) -> tuple[int, int, int, int]:
        """Audio-thread side: copy up to len(out) bytes, pad with silence. Returns what a playback report needs:
        the turn, the generation, the answer's samples handed over before this block, and the samples in it."""
        filled = 0
        with self._lock:
            before = self.played
            while filled < len(out) and self._chunks and not self.paused:
                chunk = self._chunks[0]
                take = min(len(chunk), len(out) - filled)
                out[filled : filled + take] = chunk[:take]
                filled += take
                if take == len(chunk):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = chunk[take:]
            if filled:
                self.played += filled // 2
                self.last_audio_at = now
            report = (self.turn, self.generation, before, filled // 2)
        out[filled:] = bytes(len(out) - filled)
        return report


def heard_samples(handed_to_device: int, device_latency_s: float, sample_rate: int) -> int:
    """Samples the listener has heard: what went into the device minus what is still queued there."""
    return max(0, handed_to_device - int(device_latency_s * sample_rate))


# --- the conversation -----------------------------------------------------------------------------------------------
async def run_local(engines: Engines, session_config: SessionConfig, audio: LocalAudioConfig) -> None:
    """Run a conversation on the local microphone and speakers until Ctrl+C or SIGTERM."""
    sd = sounddevice_module()
    session = Session(engines, session_config)
    devices = check_devices(sd, audio, session.output_sample_rate)
    loop = asyncio.get_running_loop()
    await session.start()
    mic: asyncio.Queue[tuple[bytes, float]] = asyncio.Queue(maxsize=200)
    speaker = SpeakerBuffer()
    counters = StreamCounters()
    echo = OwnVoice(session.output_sample_rate) if audio.cancels_echo else None
    block = TARGET_RATE * BLOCK_MS // 1000

    def on_mic(indata: Any, frames: int, time_info: Any, status: Any) -> None:
        counters.on_input(status)
        # when its first sample left the ADC, on PortAudio's clock (CLOCK_MONOTONIC on Linux; estimated from the
        # stream's latency where the host API gives no time)
        captured_at = time_info.inputBufferAdcTime or time.monotonic() - input_latency_s - frames / TARGET_RATE
        loop.call_soon_threadsafe(_offer, mic, (bytes(indata), captured_at))

    def on_speaker(outdata: Any, frames: int, time_info: Any, status: Any) -> None:
        now = time.monotonic()
        counters.on_output(status, now, speaker.sounding(now, device_latency_s))
        report = speaker.fill(memoryview(outdata).cast("B"), now)
        if echo is not None and report[3]:  # answer audio in this block: where its first sample plays
            plays_at = time_info.outputBufferDacTime or now + device_latency_s
            loop.call_soon_threadsafe(on_played, *report[:3], plays_at)

    def on_played(turn: int, generation: int, before: int, plays_at: float) -> None:
        if echo is None or generation != speaker.generation:
            return  # a stop, a resume or a new answer overtook this report
        if (position := echo.position_at(plays_at)) is not None:
            echo.played(turn, before, at=position)

    input_stream = sd.RawInputStream(
        samplerate=TARGET_RATE, blocksize=block, channels=1, dtype="int16", device=devices.input, callback=on_mic
    )
    output_stream = sd.RawOutputStream(
        samplerate=session.output_sample_rate, channels=1, dtype="int16", device=devices.output,
        callback=on_speaker, latency=audio.output_latency_s, prime_output_buffers_using_stream_callback=True,
    )  # fmt: skip
    device_latency_s = float(output_stream.latency)
    input_latency_s = float(input_stream.latency)
    log.info("speaker latency %.0f ms, microphone latency %.0f ms", device_latency_s * 1000,
             float(input_stream.latency) * 1000)  # fmt: skip

    def heard() -> int:
        return heard_samples(speaker.played, device_latency_s, session.output_sample_rate)

    async def pump_mic() -> None:
        while True:
            pcm, captured_at = await mic.get()
            if echo is not None:
                pcm, rate = echo.mic(pcm, TARGET_RATE, captured_at), ECHO_RATE  # half duplex inside once it fell back
            elif audio.half_duplex and speaker.busy(time.monotonic() - device_latency_s):
                continue  # the assistant is talking through open speakers
            else:
                rate = TARGET_RATE
            try:
                await session.feed_audio(pcm, rate)
            except AudioFormatError as err:
                print(f"[audio] dropped a frame: {err}", file=sys.stderr)

    async def show_events() -> None:
        fell_back = False
        async for event in session.events():
            if echo is not None:
                event = echo.on_event(event)
            if isinstance(event, AudioOut):
                speaker.push(event.pcm)
                session.report_played(heard())
            elif isinstance(event, AudioStart):
                speaker.new_answer(event.turn)
            elif isinstance(event, Pause | Resume):
                speaker.pause(isinstance(event, Pause))
                if echo is not None and isinstance(event, Pause):
                    echo.played(event.turn, speaker.played)  # where playback stopped: all it was handed plays out
            elif isinstance(event, Clear):
                session.report_played(heard())
                speaker.clear()
                if echo is not None:
                    echo.played(event.turn, speaker.played)
                print("  [interrupted]", flush=True)
            elif isinstance(event, Transcript) and event.final and event.text:
                print(f"you: {event.text}", flush=True)
            elif isinstance(event, AnswerDone):
                print(f"assistant: {event.text}", flush=True)
            elif isinstance(event, TurnEnd):
                show_turn_end(with_output_stats(event, counters, device_latency_s))
                if echo is not None and not fell_back and (reason := fallback_reason(echo)):
                    fell_back = True
                    print(f"  [{reason}: the microphone is muted while the assistant speaks]", flush=True)
            elif isinstance(event, ErrorEvent):
                print(f"  [error {event.code}: {event.message}]", file=sys.stderr, flush=True)

    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print("listening... speak, or press Ctrl+C to quit", flush=True)
    try:
        with input_stream, output_stream:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(pump_mic(), name=f"local-mic-{session.id}"),
                         group.create_task(show_events(), name=f"local-events-{session.id}")]  # fmt: skip
                await stop.wait()
                for task in tasks:
                    task.cancel()
            # leaving `with` stops and closes both streams: the devices are free before the models are torn down
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await session.close()
    if audio_devices.alsa_messages:
        log.info("ALSA reported %d messages (run with -v to see them in the log)", audio_devices.alsa_messages)


def fallback_reason(echo: OwnVoice) -> str | None:
    """Why local mode is (now) half duplex: the canceller cannot keep up, or after ALIGNMENT_CHECK_S of the
    assistant's voice it has taken less than MIN_ERLE_DB off the microphone (its reference is not where the speaker
    plays: a device whose clock PortAudio misreports), in which case it is switched to half duplex here. None while
    it cancels."""
    canceller = echo.canceller
    if canceller.half_duplex:
        return "the echo canceller cannot keep up"
    erle = canceller.stats().get("echo_erle_db")
    if canceller.reference_s >= ALIGNMENT_CHECK_S and erle is not None and erle < MIN_ERLE_DB:
        canceller.half_duplex = True
        return f"the echo canceller is not aligned with the speaker ({erle:.1f} dB removed)"
    return None


def with_output_stats(event: TurnEnd, counters: StreamCounters, device_latency_s: float) -> TurnEnd:
    """The turn's TurnEnd with what the audio callbacks counted since the previous turn ended."""
    stats = {**event.stats, **counters.since_last_report(), "output_latency_ms": device_latency_s * 1000}
    return replace(event, stats=stats)


def show_turn_end(event: TurnEnd) -> None:
    parts = []
    if "voice_to_voice" in event.latency_ms:
        parts.append(f"voice-to-voice {event.latency_ms['voice_to_voice']:.0f} ms")
    underruns = f"underruns {event.stats.get('output_underflows', 0):.0f}"
    if event.stats.get("output_underflows"):
        gap, latency = event.stats.get("output_callback_gap_ms", 0.0), event.stats.get("output_latency_ms", 0.0)
        underruns += (f" ({event.stats.get('audible_underflows', 0):.0f} while speaking; longest speaker callback gap "
                      f"{gap:.0f} ms, output latency {latency:.0f} ms)")  # fmt: skip
    parts.append(underruns)
    if "lm_end_of_turn" in event.stats:
        parts.append(f"LM end of turn {event.stats['lm_end_of_turn']:.2f}")
    if event.stats.get("input_overflows"):
        parts.append(f"microphone overflows {event.stats['input_overflows']:.0f}")
    if event.interrupted:
        parts.append(f"heard: {event.spoken!r}")
    print(f"  [{', '.join(parts)}]", flush=True)


def _offer(queue: asyncio.Queue[bytes], pcm: bytes) -> None:
    with contextlib.suppress(asyncio.QueueFull):  # a stalled loop drops microphone blocks instead of growing memory
        queue.put_nowait(pcm)
