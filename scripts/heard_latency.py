"""Voice-to-voice as a user hears it: an independent client of `voice-assistant serve` times each spoken turn from the
real end of the recorded speech to the first assistant sample it receives.

    python scripts/heard_latency.py --spawn [--turns 60] [--json FILE] [AUDIO.wav ...]
    python scripts/heard_latency.py --url ws://127.0.0.1:8765/ws [...]

Independent on purpose: it shares no code with the session (no import of voice/, web/ or model/; only the WebSocket
protocol of web/PROTOCOL.md), and it finds where each recording's speech really ends from the recording itself (the
last 10 ms frame within 35 dB of the loudest one), not from the server's VAD, whose last voiced sample can fall
before or after it. Recordings are streamed in 20 ms frames at real-time pace, as a microphone delivers them, and
silence keeps flowing after them (a user who waits, then listens to the whole answer), so the endpointer, the early
answer and the turn detector meet the stream a person would send. A turn's figure is the arrival of its first binary
frame minus the moment its last speech sample was captured (the send time of the frame holding it, less what of that
frame follows it). The server's own `turn_end.latency_ms` (from its VAD's last voiced sample to the first sample sent)
is kept beside it, with its stage breakdown and speculative-TTS counts.

Default inputs are held out: Debian's `asterisk-core-sounds-en-wav` (a professional voice's telephony prompts, 8 kHz:
"The conference has ended.", "Press.", "Please enter your agent number."), which no test, tuning or training of this
project uses; a fixed, seeded choice of `--turns` prompts of 0.6-4 s. `make report` installs the package.

Exit 2 with one line for an unreachable server, an unreadable recording or no inputs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import subprocess
import sys
import time
import wave
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

HELD_OUT_DIR = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
RATE = 16000  # what this client announces in its hello and streams
FRAME_S = 0.02
LEAD_IN_S = 0.3  # silence before each recording: a person does not start speaking with the first sample
QUIET_DB = 35.0  # a frame is speech while within this many dB of the recording's loudest 10 ms
TURN_TIMEOUT_S = 30.0
AFTER_ANSWER_S = 0.8  # listening on after the answer's audio has played, before the next turn


# --- the core: no I/O -------------------------------------------------------------------------------------------------


def speech_end(samples: np.ndarray, rate: int, quiet_db: float = QUIET_DB) -> int:
    """One past the last sample of speech in `samples` (float, mono): the end of the last 10 ms frame whose RMS is
    within `quiet_db` of the loudest frame's. 0 for a recording with no sound."""
    frame = max(1, rate // 100)
    usable = len(samples) // frame * frame
    if usable == 0:
        return 0
    rms = np.sqrt(np.mean(np.square(samples[:usable].reshape(-1, frame).astype(np.float64)), axis=1))
    if rms.max() <= 0.0:
        return 0
    loud = np.nonzero(rms >= rms.max() * 10 ** (-quiet_db / 20))[0]
    return int(loud[-1] + 1) * frame


def to_rate(samples: np.ndarray, rate: int, target: int = RATE) -> np.ndarray:
    """`samples` at `target` Hz by linear interpolation (telephony prompts are 8 kHz; Whisper takes 16 kHz)."""
    if rate == target:
        return samples.astype(np.float32)
    times = np.arange(round(len(samples) * target / rate)) * (rate / target)
    return np.interp(times, np.arange(len(samples)), samples).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class Turn:
    """One recording as one user turn, and what the client heard of its answer."""

    source: str
    speech_s: float  # the recording's speech, start of the file to its real end
    heard_ms: float | None = None  # real end of speech -> first assistant sample received
    server_ms: float | None = None  # the server's own voice_to_voice (its VAD's last voiced sample -> first sent)
    user_text: str = ""
    answer: str = ""
    latency_ms: dict[str, float | None] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def summary(turns: list[Turn]) -> dict[str, Any]:
    """Percentiles of the heard and the server's figures, the stages' medians and the speculative-TTS counts."""
    heard = [t.heard_ms for t in turns if t.heard_ms is not None]
    server = [t.server_ms for t in turns if t.server_ms is not None]
    stages = ("asr_final", "lm_first_pass", "first_phrase_committed", "tts_first_chunk", "first_audio_out")
    stage_medians = {
        name: percentile([v for t in turns if (v := t.latency_ms.get(name)) is not None], 50) for name in stages
    }
    hits = sum(t.stats.get("hits", 0) for t in turns)
    return {
        "turns": len(turns),
        "answered": len(heard),
        "heard_ms": {"p50": percentile(heard, 50), "p95": percentile(heard, 95), "max": max(heard, default=None)},
        "server_ms": {"p50": percentile(server, 50), "p95": percentile(server, 95)},
        "held_past_1s": sum(1 for v in heard if v > 1000.0),
        "stage_p50_ms": stage_medians,
        "speculative_tts": {
            "hits": hits,
            "misses": sum(t.stats.get("misses", 0) for t in turns),
            "hits_per_turn": hits / len(turns) if turns else None,
            "saved_ms": sum(t.stats.get("saved_ms", 0.0) for t in turns),
        },
    }


def held_out(count: int, seed: int = 0, folder: Path = HELD_OUT_DIR) -> list[Path]:
    """`count` prompts of 0.6-4 s from the held-out collection, the same ones on every run (cycled if too few)."""
    prompts = []
    for path in sorted(folder.glob("*.wav")):
        with contextlib.suppress(wave.Error, OSError), wave.open(str(path)) as w:
            if 0.6 <= w.getnframes() / w.getframerate() <= 4.0:
                prompts.append(path)
    if not prompts:
        return []
    chosen = random.Random(seed).sample(prompts, min(count, len(prompts)))
    return [chosen[i % len(chosen)] for i in range(count)]


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A PCM16 WAV as mono float samples and its rate."""
    with wave.open(str(path)) as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: {8 * w.getsampwidth()}-bit audio; this client reads 16-bit PCM WAV")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        return data.reshape(-1, w.getnchannels()).mean(axis=1), w.getframerate()


# --- the shell: one WebSocket conversation ---------------------------------------------------------------------------


class Listener:
    """Reads the server's messages: the arrival of every binary frame, the current answer's length, and each turn's
    end."""

    def __init__(self) -> None:
        self.audio_arrivals: list[float] = []  # monotonic seconds of every binary frame
        self.answer_samples = 0  # assistant samples of the latest answer (since its audio_start)
        self.answer_sent = asyncio.Event()  # its audio_end (or clear) arrived: all of it is here
        self.output_rate = 22050
        self.ends: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.errors: list[str] = []

    async def run(self, ws: ClientConnection) -> None:
        try:
            async for message in ws:
                now = time.monotonic()
                if isinstance(message, bytes):
                    self.audio_arrivals.append(now)
                    self.answer_samples += len(message) // 2
                    continue
                event = json.loads(message)
                kind = event.get("type")
                if kind in ("ready", "audio_start") and event.get("sample_rate"):
                    self.output_rate = int(event["sample_rate"])
                if kind == "audio_start":
                    self.answer_samples = 0
                    self.answer_sent.clear()
                elif kind in ("audio_end", "clear"):
                    self.answer_sent.set()
                elif kind == "turn_end" or (kind == "transcript" and event.get("final") and not event.get("text")):
                    self.ends.put_nowait(event)
                elif kind == "error":
                    self.errors.append(f"{event.get('code')}: {event.get('message')}")
        except ConnectionClosed as closed:
            self.errors.append(f"connection closed: {closed}")
        finally:
            self.answer_sent.set()
            self.ends.put_nowait({"type": "closed"})


class Microphone:
    """Sends 20 ms frames at real-time pace from one clock, speech or silence, and notes when each was sent."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frame = int(RATE * FRAME_S)
        self.next_at = time.monotonic()

    async def send(self, samples: np.ndarray) -> list[float]:
        """Each frame's send time (monotonic), paced as a microphone delivers: a frame leaves once it is whole."""
        sent = []
        for start in range(0, len(samples), self.frame):
            self.next_at += FRAME_S
            await asyncio.sleep(max(0.0, self.next_at - time.monotonic()))
            await self.ws.send(pcm16(samples[start:start + self.frame]))
            sent.append(time.monotonic())
        return sent

    async def silence_until(self, done: asyncio.Future[Any], limit_s: float) -> None:
        """Silence, frame by frame, until `done` or for `limit_s` at most."""
        quiet = np.zeros(self.frame, dtype=np.float32)
        deadline = time.monotonic() + limit_s
        while not done.done() and time.monotonic() < deadline:
            await self.send(quiet)

    async def silence_for(self, seconds: float) -> None:
        await self.silence_until(asyncio.get_running_loop().create_future(), seconds)


async def run_turn(mic: Microphone, listener: Listener, path: Path) -> Turn:
    raw, rate = read_wav(path)
    samples = to_rate(raw, rate)
    end = speech_end(samples, RATE)
    turn = Turn(str(path), speech_s=end / RATE)
    if end == 0:
        turn.errors.append("no sound in this recording")
        return turn
    lead = np.zeros(int(LEAD_IN_S * RATE), dtype=np.float32)
    stream = np.concatenate([lead, samples])
    arrivals_before, errors_before = len(listener.audio_arrivals), len(listener.errors)
    sent = await mic.send(stream)
    at = len(lead) + end - 1  # the last speech sample, in the stream
    frame_index = at // mic.frame
    real_end = sent[frame_index] - ((frame_index + 1) * mic.frame - 1 - at) / RATE
    ended = asyncio.ensure_future(listener.ends.get())
    await mic.silence_until(ended, TURN_TIMEOUT_S)
    if not ended.done():
        ended.cancel()
        turn.errors.append(f"no turn_end within {TURN_TIMEOUT_S:.0f} s of the recording's end")
        return turn
    event = ended.result()
    first = next((t for t in listener.audio_arrivals[arrivals_before:] if t >= real_end), None)
    turn.heard_ms = (first - real_end) * 1000.0 if first is not None else None
    latency = event.get("latency_ms") or {}
    turn.server_ms = latency.get("voice_to_voice")
    turn.latency_ms, turn.stats = latency, event.get("stats") or {}
    turn.user_text, turn.answer = event.get("user_text", event.get("text", "")), event.get("answer", "")
    turn.errors.extend(listener.errors[errors_before:])
    if event.get("type") == "closed":
        turn.errors.append("the server closed the connection")
        return turn
    if first is not None:  # a person listens to the whole answer before speaking again
        sent_all = asyncio.ensure_future(listener.answer_sent.wait())
        await mic.silence_until(sent_all, TURN_TIMEOUT_S)
        sent_all.cancel()
        played_until = first + listener.answer_samples / listener.output_rate
        await mic.silence_for(played_until - time.monotonic() + AFTER_ANSWER_S)
    while not listener.ends.empty():  # a recording the server heard as two turns: the later one ended too
        if listener.ends.get_nowait().get("type") == "turn_end":
            turn.errors.append("the server made more than one turn of this recording")
    return turn


async def conversation(url: str, paths: list[Path], echo_cancellation: str = "client") -> list[Turn]:
    try:
        ws = await connect(url, max_size=2**22, open_timeout=15)
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as error:
        raise ConnectionError(f"cannot reach {url}: {error}") from error
    async with ws:
        hello = {"type": "hello", "sample_rate": RATE, "echo_cancellation": echo_cancellation}
        await ws.send(json.dumps(hello))
        listener = Listener()
        reader = asyncio.create_task(listener.run(ws), name="heard-latency-reader")
        mic = Microphone(ws)
        turns = []
        for index, path in enumerate(paths, 1):
            turn = await run_turn(mic, listener, path)
            turns.append(turn)
            shown = f"{turn.heard_ms:.0f} ms" if turn.heard_ms is not None else "no audio"
            print(f"{index:3d}/{len(paths)} {Path(turn.source).name:32s} heard {shown:>9s}  {turn.user_text!r}",
                  file=sys.stderr, flush=True)
            if any("closed" in e for e in turn.errors):
                break
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    return turns


# --- a server of our own, for --spawn --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_server(port: int, extra: list[str], log: Path) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).parent / "voice-assistant"), "serve", "--host", "127.0.0.1",
               "--port", str(port), *extra]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


async def wait_ready(port: int, server: subprocess.Popen[bytes], limit_s: float = 300.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ConnectionError(f"the spawned server exited with {server.returncode}")
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /readyz HTTP/1.0\r\n\r\n")
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        await asyncio.sleep(0.5)
    raise ConnectionError(f"the spawned server was not ready within {limit_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("audio", nargs="*", type=Path, help="16-bit PCM WAV recordings, one user turn each")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server's WebSocket, e.g. ws://127.0.0.1:8765/ws")
    target.add_argument("--spawn", action="store_true", help="start `voice-assistant serve` on a free port")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="one more argument for the spawned server (repeatable): --server-arg=--no-speculation")
    parser.add_argument("--turns", type=int, default=60, help="turns (held-out prompts, or the given files cycled)")
    parser.add_argument("--seed", type=int, default=0, help="which held-out prompts")
    parser.add_argument("--json", type=Path, help="write every turn and the summary here")
    parser.add_argument("--echo-cancellation", choices=("client", "server"), default="client",
                        help="what `hello` asks for: server, the server cancels the answers' echo from this "
                        "microphone (what it costs the latency; this client feeds no echo back)")
    args = parser.parse_args(argv)

    given = args.audio
    paths = [given[i % len(given)] for i in range(args.turns)] if given else held_out(args.turns, args.seed)
    if not paths:
        print(f"heard_latency: no inputs: give WAV files, or install asterisk-core-sounds-en-wav ({HELD_OUT_DIR})",
              file=sys.stderr)
        return 2
    for path in set(paths):
        try:
            read_wav(path)
        except (OSError, EOFError, wave.Error, ValueError) as error:
            print(f"heard_latency: cannot read {path}: {error}", file=sys.stderr)
            return 2

    server = None
    url = args.url
    try:
        if args.spawn:
            port = free_port()
            server = spawn_server(port, args.server_arg, Path(f"/tmp/heard-latency-server-{port}.log"))
            asyncio.run(wait_ready(port, server))
            url = f"ws://127.0.0.1:{port}/ws"
        turns = asyncio.run(conversation(url, paths, args.echo_cancellation))
    except ConnectionError as error:
        print(f"heard_latency: {error}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=45)

    result = summary(turns)
    heard, server_ms = result["heard_ms"], result["server_ms"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    print(f"voice-to-voice as heard (real end of speech -> first sample received), {result['answered']} of "
          f"{result['turns']} turns answered: p50 {ms(heard['p50'])} ms, p95 {ms(heard['p95'])} ms, max "
          f"{ms(heard['max'])} ms; the server's own figure p50 {ms(server_ms['p50'])}, p95 {ms(server_ms['p95'])} ms; "
          f"held past 1 s: {result['held_past_1s']}")
    print("stage p50 (ms): " + ", ".join(f"{k} {ms(v)}" for k, v in result["stage_p50_ms"].items()))
    tts = result["speculative_tts"]
    print(f"speculative TTS: {tts['hits']:.0f} hits, {tts['misses']:.0f} misses, "
          f"{tts['hits_per_turn'] or 0:.2f} hits a turn, {tts['saved_ms']:.0f} ms saved in all")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": result, "turns": [asdict(t) for t in turns]}, indent=1))
    return 0 if result["answered"] else 1


if __name__ == "__main__":
    sys.exit(main())
