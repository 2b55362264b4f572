"""Local mode: talk to the assistant through this machine's microphone and speakers (PortAudio via `sounddevice`).

The PortAudio callbacks run in audio threads: the microphone callback only copies its block onto the event loop, and
the speaker callback only copies queued PCM out and counts what it played, so nothing slow ever runs in an audio
thread. With open speakers (the default) the microphone is muted while the assistant's audio is still playing, so the
assistant cannot interrupt itself; with `--headset` it listens all the time and you can barge in.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from voice.engines import Engines
from voice.errors import AudioFormatError, NoAudioDevice
from voice.events import AnswerDone, AudioOut, AudioStart, Clear, ErrorEvent, Transcript, TurnEnd
from voice.io.audio import TARGET_RATE
from voice.session import Session, SessionConfig

BLOCK_MS = 20
ECHO_TAIL_S = 0.3  # keep the microphone muted this long after the speaker went quiet (room echo)


@dataclass(frozen=True, slots=True)
class LocalAudioConfig:
    input_device: int | str | None = None
    output_device: int | str | None = None
    headset: bool = False  # full duplex: barge-in works, but open speakers would make the assistant hear itself


def sounddevice_module() -> Any:
    try:
        import sounddevice
    except OSError as err:  # the Python package imports PortAudio, a system library
        raise NoAudioDevice(f"the PortAudio library is missing ({err}); `make install` installs libportaudio2") from err
    return sounddevice


def list_devices() -> str:
    sd = sounddevice_module()
    devices = sd.query_devices()
    return str(devices) if len(devices) else "no audio devices found"


def check_devices(sd: Any, config: LocalAudioConfig) -> None:
    try:
        sd.check_input_settings(device=config.input_device, channels=1, dtype="int16", samplerate=TARGET_RATE)
    except (sd.PortAudioError, ValueError) as err:
        raise NoAudioDevice(
            f"no usable microphone ({err}). Run `voice-assistant --list-devices`, pick one with --input-device, or use "
            "`voice-assistant serve` and talk in a browser, or `voice-assistant file IN.wav --out OUT.wav`."
        ) from err
    try:
        sd.check_output_settings(device=config.output_device, channels=1, dtype="int16")
    except (sd.PortAudioError, ValueError) as err:
        raise NoAudioDevice(f"no usable speaker ({err}); pick one with --output-device (see --list-devices)") from err


class SpeakerBuffer:
    """PCM waiting for the speaker; filled from the event loop, drained by the audio thread."""

    def __init__(self) -> None:
        self._chunks: deque[memoryview] = deque()
        self._lock = threading.Lock()
        self.played = 0  # samples of the current answer that reached the speaker
        self.last_audio_at = 0.0

    def push(self, pcm: bytes) -> None:
        with self._lock:
            self._chunks.append(memoryview(pcm))

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()

    def new_answer(self) -> None:
        with self._lock:
            self.played = 0

    def busy(self, now: float) -> bool:
        with self._lock:
            return bool(self._chunks) or now - self.last_audio_at < ECHO_TAIL_S

    def fill(self, out: memoryview, now: float) -> None:
        """Audio-thread side: copy up to len(out) bytes, pad with silence."""
        filled = 0
        with self._lock:
            while filled < len(out) and self._chunks:
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
        out[filled:] = bytes(len(out) - filled)


async def run_local(engines: Engines, session_config: SessionConfig, audio: LocalAudioConfig) -> None:
    """Run a conversation on the local microphone and speakers until Ctrl+C."""
    sd = sounddevice_module()
    check_devices(sd, audio)
    loop = asyncio.get_running_loop()
    session = Session(engines, session_config)
    await session.start()
    mic: asyncio.Queue[bytes] = asyncio.Queue(maxsize=200)
    speaker = SpeakerBuffer()

    def on_mic(indata: Any, frames: int, time_info: Any, status: Any) -> None:
        loop.call_soon_threadsafe(_offer, mic, bytes(indata))

    def on_speaker(outdata: Any, frames: int, time_info: Any, status: Any) -> None:
        speaker.fill(memoryview(outdata).cast("B"), time_info.currentTime if time_info else 0.0)

    block = TARGET_RATE * BLOCK_MS // 1000
    input_stream = sd.RawInputStream(
        samplerate=TARGET_RATE, blocksize=block, channels=1, dtype="int16", device=audio.input_device, callback=on_mic
    )
    output_stream = sd.RawOutputStream(
        samplerate=session.output_sample_rate, channels=1, dtype="int16", device=audio.output_device,
        callback=on_speaker,
    )

    async def pump_mic() -> None:
        while True:
            pcm = await mic.get()
            if not audio.headset and speaker.busy(output_stream.time):
                continue  # the assistant is talking through open speakers
            try:
                await session.feed_audio(pcm, TARGET_RATE)
            except AudioFormatError as err:
                print(f"[audio] dropped a frame: {err}", file=sys.stderr)

    async def show_events() -> None:
        async for event in session.events():
            if isinstance(event, AudioOut):
                speaker.push(event.pcm)
                session.report_played(speaker.played)
            elif isinstance(event, AudioStart):
                speaker.new_answer()
            elif isinstance(event, Clear):
                session.report_played(speaker.played)
                speaker.clear()
                print("  [interrupted]")
            elif isinstance(event, Transcript) and event.final and event.text:
                print(f"you: {event.text}")
            elif isinstance(event, AnswerDone):
                print(f"assistant: {event.text}")
            elif isinstance(event, TurnEnd) and "voice_to_voice" in event.latency_ms:
                print(f"  [voice-to-voice {event.latency_ms['voice_to_voice']:.0f} ms]")
            elif isinstance(event, ErrorEvent):
                print(f"  [error {event.code}: {event.message}]", file=sys.stderr)

    print("listening... speak, or press Ctrl+C to quit", flush=True)
    with input_stream, output_stream:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(pump_mic(), name=f"local-mic-{session.id}")
                group.create_task(show_events(), name=f"local-events-{session.id}")
        finally:
            await session.close()


def _offer(queue: asyncio.Queue[bytes], pcm: bytes) -> None:
    with contextlib.suppress(asyncio.QueueFull):  # a stalled loop drops microphone blocks instead of growing memory
        queue.put_nowait(pcm)
