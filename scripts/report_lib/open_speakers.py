"""An independent-style `/ws` client on simulated open speakers: what it plays comes back into its microphone.

The client speaks real recorded clips, plays the assistant's answers on a simulated loudspeaker (pausing, resuming
and clearing as the protocol asks, reporting `played` every 250 ms and on every stop) and sends its microphone every
20 ms in real time: the user's clip (when speaking) plus the room's echo of what it played (`Room`: a delay, a
decaying tail, a gain) plus noise. It keeps a log of what it heard and when, from which `judge` counts turns started by
the echo, answers cut by their own echo, and how soon each barge-in was heard.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voice.audio import StreamResampler

RATE = 16_000
TICK = 320  # 20 ms of microphone audio a frame


def voice_onset(samples: np.ndarray, below_peak_db: float = 20.0) -> int:
    """Where a recording's voice begins: its first 10 ms within `below_peak_db` of its loudest 10 ms (the card
    clips open with 120-280 ms of room tone, which is nobody talking yet)."""
    frames = samples[: len(samples) // 160 * 160].reshape(-1, 160)
    if not len(frames):
        return 0
    energy = np.mean(frames.astype(np.float64) ** 2, axis=1)
    return int(np.argmax(energy >= energy.max() * 10 ** (-below_peak_db / 10))) * 160


@dataclass(frozen=True, slots=True)
class Room:
    """The loudspeaker-to-microphone path of a laptop on a desk."""

    delay_s: float = 0.12
    gain_db: float = -8.0
    tail_s: float = 0.25
    decay_s: float = 0.05  # the tail falls by 1/e every 50 ms
    noise_db: float = -60.0  # microphone noise, dBFS
    seed: int = 0

    def impulse(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        n = int(self.tail_s * RATE)
        tail = rng.standard_normal(n) * np.exp(-np.arange(n) / (self.decay_s * RATE))
        tail[0] = 3.0
        tail /= np.sqrt(np.sum(tail**2))
        return (np.concatenate([np.zeros(int(self.delay_s * RATE)), tail]) * 10 ** (self.gain_db / 20)).astype(
            np.float32)


@dataclass
class Speaker:
    """The client's loudspeaker: a buffer per turn, paused or not, and the room's echo of what it plays."""

    impulse: np.ndarray
    turn: int | None = None
    buffer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    paused: bool = False
    played: int = 0  # 16 kHz samples of `turn` played
    resampler: StreamResampler | None = None
    _tail: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def play(self) -> np.ndarray:
        """The next 20 ms the loudspeaker plays (silence while paused or empty)."""
        chunk = np.zeros(TICK, np.float32)
        if not self.paused and len(self.buffer):
            n = min(TICK, len(self.buffer))
            chunk[:n], self.buffer = self.buffer[:n], self.buffer[n:]
            self.played += n
        return chunk

    def echo(self, chunk: np.ndarray) -> np.ndarray:
        """What the microphone hears of `chunk` now (overlap-add: the room's tail rings into later frames)."""
        full = np.convolve(chunk, self.impulse) if chunk.any() else np.zeros(TICK + len(self.impulse) - 1, np.float32)
        if len(self._tail):
            full[: len(self._tail)] += self._tail
        self._tail = full[TICK:]
        return full[:TICK].astype(np.float32)


@dataclass
class Log:
    """What happened, on the client's clock (seconds since the conversation began)."""

    # start (when the recording's voice begins: its leading silence is nobody talking yet), end, text, barge-in
    utterances: list[tuple[float, float, str, bool]] = field(default_factory=list)
    messages: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    turn_ends: list[dict[str, Any]] = field(default_factory=list)


class OpenSpeakerClient:
    """Drive one conversation: `say` a clip, `wait_turn_end`, `barge_in_after`; `log` holds the outcome."""

    def __init__(self, ws: Any, room: Room, server_cancels: bool, mic_rate: int = RATE) -> None:
        self.ws = ws
        self.server_cancels = server_cancels
        self.mic_rate = mic_rate  # the rate its microphone sends at (`hello`): the room is simulated at 16 kHz
        self._mic_resampler = StreamResampler(RATE, mic_rate)
        self.speaker = Speaker(room.impulse())
        self.noise = np.random.default_rng(room.seed + 1)
        self.noise_level = 10 ** (room.noise_db / 20)
        self.log = Log()
        self.out_rate = 22_050
        self._voice = np.zeros(0, np.float32)  # what the user is still to say
        self._turn_end = asyncio.Event()
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def hello(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "hello", "sample_rate": self.mic_rate}
        if self.server_cancels:
            message["echo_cancellation"] = "server"
        await self.ws.send(json.dumps(message))
        while True:
            frame = await self.ws.recv()
            if isinstance(frame, str) and (ready := json.loads(frame))["type"] == "ready":
                self.out_rate = ready["sample_rate"]
                if ready.get("echo_cancellation", "client") == ("server" if self.server_cancels else "client"):
                    return ready

    async def run(self) -> None:
        """The microphone and the loudspeaker (every 20 ms, on an absolute schedule) and the receiver, until
        cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._receive(), name="open-speakers-receive")
            group.create_task(self._tick(), name="open-speakers-tick")

    async def say(self, samples: np.ndarray, text: str, barge_in: bool = False) -> None:
        """Speak `samples` into the microphone (mixed with the echo) and return when they have all been sent."""
        start = self.now() + (len(self._voice) + voice_onset(samples)) / RATE
        self._voice = np.concatenate([self._voice, samples.astype(np.float32)])
        await asyncio.sleep((len(self._voice) + TICK) / RATE)  # the microphone sends 20 ms of it every 20 ms
        self.log.utterances.append((start, self.now(), text, barge_in))

    async def wait_turn_end(self, limit_s: float) -> bool:
        self._turn_end.clear()
        try:
            async with asyncio.timeout(limit_s):
                await self._turn_end.wait()
        except TimeoutError:
            return False
        return True

    async def until_played(self, seconds: float, limit_s: float, after_turn: int | None) -> bool:
        """Wait until the loudspeaker has played `seconds` of an answer later than `after_turn` (False if none got
        that far in time)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            turn = self.speaker.turn
            if turn is not None and (after_turn is None or turn > after_turn) and self.speaker.played >= seconds * RATE:
                return True
            await asyncio.sleep(0.01)
        return False

    async def quiet(self, seconds: float) -> None:
        """Wait until nothing has played for `seconds` (the room is silent again)."""
        while True:
            await asyncio.sleep(seconds)
            if not len(self.speaker.buffer) or self.speaker.paused:
                return

    async def _tick(self) -> None:
        next_at = time.monotonic()
        sent = 0
        while True:
            played = self.speaker.play()
            mic = self.speaker.echo(played) + self.noise.standard_normal(TICK).astype(np.float32) * self.noise_level
            if len(self._voice):
                n = min(TICK, len(self._voice))
                mic[:n] += self._voice[:n]
                self._voice = self._voice[n:]
            mic = self._mic_resampler.push(mic)
            if len(mic):  # a resampler's first pushes fill its filter and give nothing: an empty frame is refused
                await self.ws.send((np.clip(mic, -1, 1) * 32767).astype("<i2").tobytes())
            sent += 1
            if sent % 12 == 0 and self.speaker.turn is not None and played.any():
                await self._report_played()
            next_at += TICK / RATE
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def _report_played(self) -> None:
        speaker = self.speaker
        samples = speaker.played * self.out_rate // RATE
        await self.ws.send(json.dumps({"type": "played", "turn": speaker.turn, "samples": samples}))

    async def _receive(self) -> None:
        speaker = self.speaker
        async for frame in self.ws:
            if isinstance(frame, bytes):
                if speaker.resampler is not None:
                    pcm = np.frombuffer(frame, "<i2").astype(np.float32) / 32768
                    speaker.buffer = np.concatenate([speaker.buffer, speaker.resampler.push(pcm)])
                continue
            message = json.loads(frame)
            self.log.messages.append((self.now(), message))
            kind = message["type"]
            if kind == "audio_start":
                speaker.turn, speaker.played, speaker.paused = message["turn"], 0, False
                speaker.buffer = np.zeros(0, np.float32)
                speaker.resampler = StreamResampler(message["sample_rate"], RATE)
            elif kind == "pause" and message["turn"] == speaker.turn:
                speaker.paused = True
                await self._report_played()
            elif kind == "resume" and message["turn"] == speaker.turn:
                speaker.paused = False
            elif kind == "clear" and message["turn"] == speaker.turn:
                speaker.buffer = np.zeros(0, np.float32)
                await self._report_played()
            elif kind == "turn_end":
                self.log.turn_ends.append(message)
                self._turn_end.set()


def judge(log: Log) -> dict[str, Any]:
    """The conversation's figures: turns started by the echo (a `vad` speech start with nobody speaking), answers
    cut by their own echo (a `clear` with no barge-in just before it), and each barge-in's delay from its voice's
    first sound to its `pause` and its `clear`."""
    def user_near(t: float, before_s: float, after_s: float) -> bool:
        return any(start - before_s <= t <= end + after_s for start, end, _, _ in log.utterances)

    starts = [t for t, m in log.messages if m["type"] == "vad" and m["state"] == "speech_start"]
    echo_starts = [t for t in starts if not user_near(t, 0.3, 1.0)]
    # a barge-in soon after the user's own turn clears as the user going on with it ("user_continued"): any clear
    # this client did not ask for (it never sends `interrupt` or `text`) is the server hearing a voice over the answer
    clears = [t for t, m in log.messages if m["type"] == "clear"]
    self_cut = [t for t in clears if not any(bi and s <= t <= s + 3.0 for s, _, _, bi in log.utterances)]
    pauses = [t for t, m in log.messages if m["type"] == "pause"]
    echo_pauses = [t for t in pauses if not user_near(t, 0.3, 1.0)]
    heard, to_pause = [], []
    for start, _, _, barge_in in log.utterances:
        if barge_in:
            heard.append(next((t - start for t in clears if start <= t <= start + 3.0), None))
            to_pause.append(next((t - start for t in pauses if start <= t <= start + 3.0), None))
    return {
        "user_utterances": len(log.utterances),
        "turns_started_by_echo": len(echo_starts),
        "self_interruptions": len(self_cut),
        "pauses_by_echo": len(echo_pauses),
        "barge_ins": len(heard),
        "barge_in_clear_s": heard,
        "barge_in_pause_s": to_pause,
        "barge_ins_heard_within_1s": sum(1 for d in heard if d is not None and d <= 1.0),
        "turn_ends": len(log.turn_ends),
    }


def timeline(log: Log) -> str:
    """The conversation as lines a failed check can print: what the user said and when, and each message but the
    drafts and the audio, on the client's clock."""
    said = [(start, f"user says {text!r} until {end:.2f}" + (" (barge-in)" if barge_in else ""))
            for start, end, text, barge_in in log.utterances]
    heard = [(t, ", ".join(f"{k}={v!r}" for k, v in m.items() if k not in ("pieces", "stats")))
             for t, m in log.messages if m["type"] not in ("draft", "audio")]
    return "\n".join(f"{t:7.2f}  {line}" for t, line in sorted(said + heard, key=lambda item: item[0]))

