"""Single-session soak of the voice server: one WebSocket conversation of N spoken turns in real time, by turn index.

    python scripts/soak_session.py --spawn [--turns 60] [--json artifacts/soak_session.json]
    python scripts/soak_session.py --ws ws://127.0.0.1:8765/ws [--server-pid PID] ...

The client behaves like a person with a microphone: it streams 20 ms frames continuously (silence between turns),
speaks a clip, then waits for the answer and until the assistant has been quiet for `--quiet-s` (1 s) before the next
clip. Clips are speech the tests do not use (report_lib/soak_inputs.py): synthesised questions and real recordings.

Per turn: voice-to-voice (the server's figure and the client's), prompt tokens and how many the LM had to encode,
answer length, repeated 3-gram rate, 3-word loops and non-words ("that'm"), whether the turn was answered with audio
and in step (its answer, audio and turn_end carry its own turn number, and nothing of an earlier turn arrives after
it began), and the server's resident memory. The summary checks what issue 21 asks: every turn answered with audio
and in step, p50 of the last 10 turns within 20 % of the first 10, memory growth after warm-up within
`--max-growth-mb`, no loop, no non-word. Exit status 0 either way; the verdicts are in the output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scripts.report_lib.answer_quality import has_ngram_loop, non_words, repeated_ngram_rate
from scripts.report_lib.load import LoadTestError, SpawnedServer, add_server_target, check_loopback, pid_of, rss_mb
from scripts.report_lib.page import machine_info
from scripts.report_lib.results import print_and_save
from scripts.report_lib.runners import ServerUnreachable, VoiceConnection
from scripts.report_lib.soak_inputs import soak_turns
from voice.audio import TARGET_RATE, float32_to_pcm16, load_audio_16k

FRAME_MS = 20
FRAME_BYTES = TARGET_RATE * FRAME_MS // 1000 * 2
SILENCE = bytes(FRAME_BYTES)
MAX_LAG_S = 0.1  # the server refuses audio faster than 1.5x real time
TURN_TIMEOUT_S = 120.0
TURN_OUTPUT = {"draft", "answer", "audio_start", "turn_end"}  # what an answer sends: late when its turn is over
WARMUP_TURNS = 5  # memory is compared from the end of the warm-up (model kernels, caches of first use)


@dataclass(slots=True)
class SoakTurn:
    index: int
    clip: str
    turn: int | None = None  # the server's turn number for this clip (the last one, if the clip was split)
    transcript: str = ""
    answer: str = ""
    voice_to_voice_ms: float | None = None
    client_voice_to_voice_ms: float | None = None
    prompt_tokens: int | None = None
    prompt_tokens_encoded: int | None = None
    answer_words: int = 0
    repeated_3gram_rate: float = 0.0
    loop_3gram: bool = False
    non_words: list[str] = field(default_factory=list)
    audio_s: float = 0.0
    interrupted: bool = False  # the server ended the turn as interrupted (barge-in or cancelled)
    turns_started: int = 0  # speech starts the server saw during this clip (2: the clip was split)
    late_messages: int = 0  # messages of an earlier turn that arrived after this clip's speech began
    in_step: bool = False
    rss_mb: float | None = None
    errors: list[str] = field(default_factory=list)


class Listener:
    """Reads the server's frames and keeps what the soak needs: per turn, its turn_end, audio and timings."""

    def __init__(self, output_rate: int) -> None:
        self.output_rate = output_rate
        self.speech_starts: list[int] = []
        self.speech_end_at: dict[int, float] = {}
        self.turn_ends: dict[int, dict[str, Any]] = {}
        self.audio_bytes: dict[int, int] = {}
        self.first_audio_at: dict[int, float] = {}
        self.audio_ended: set[int] = set()
        self.last_audio_at = 0.0
        self.audio_turn: int | None = None
        self.current_turn = 0  # the newest turn the user started
        self.late: dict[int, int] = {}  # per current turn: messages of older turns received while it ran
        self.errors: list[str] = []
        self.changed = asyncio.Event()
        self.closed = False

    def on_text(self, message: dict[str, Any], now: float) -> None:
        kind, turn = message.get("type"), message.get("turn")
        if isinstance(turn, int) and turn < self.current_turn and kind in TURN_OUTPUT:
            self.late[self.current_turn] = self.late.get(self.current_turn, 0) + 1
        if kind == "vad" and message.get("state") == "speech_start" and isinstance(turn, int):
            self.speech_starts.append(turn)
            self.current_turn = max(self.current_turn, turn)
        elif kind == "vad" and message.get("state") == "speech_end":
            self.speech_end_at[turn] = now - float(message.get("endpoint_ms") or 0.0) / 1000.0
        elif kind == "audio_start":
            self.audio_turn = turn
        elif kind == "audio_end":
            self.audio_ended.add(turn)
        elif kind == "turn_end":
            self.turn_ends[turn] = message
        elif kind == "transcript" and message.get("final") and not str(message.get("text", "")).strip():
            self.turn_ends.setdefault(turn, {"type": "no_words", "turn": turn})
        elif kind == "error":
            self.errors.append(f"turn {turn}: {message.get('code')}: {message.get('message')}")
        self.changed.set()

    def on_audio(self, frame: bytes, now: float) -> None:
        self.last_audio_at = now
        if self.audio_turn is not None:
            self.audio_bytes[self.audio_turn] = self.audio_bytes.get(self.audio_turn, 0) + len(frame)
            self.first_audio_at.setdefault(self.audio_turn, now)
        self.changed.set()

    async def wait_for(self, predicate: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.closed or time.monotonic() > deadline:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.1)
        return True


class Microphone:
    """Streams 20 ms frames in real time forever: the queued clip's frames, else silence."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self._pending: list[bytes] = []
        self.idle = asyncio.Event()
        self.idle.set()

    def speak(self, pcm: bytes) -> None:
        self._pending = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]
        self.idle.clear()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        started, index = loop.time(), 0
        while True:
            if self._pending:
                frame = self._pending.pop(0)
                frame += bytes(FRAME_BYTES - len(frame))
            else:
                frame = SILENCE
                self.idle.set()
            await self._send(frame)
            index += 1
            due = started + index * FRAME_MS / 1000
            if loop.time() - due > MAX_LAG_S:  # a busy client must not catch up in a burst: a microphone can't
                started, index = loop.time(), 0
                continue
            await asyncio.sleep(max(0.0, due - loop.time()))


async def soak(url: str, clips: list[Path], pid: int | None, quiet_s: float) -> list[SoakTurn]:
    turns: list[SoakTurn] = []
    async with VoiceConnection(url) as connection:
        listener = Listener(int(connection.ready.get("sample_rate") or 22050))
        mic = Microphone(connection.send)

        async def read() -> None:
            try:
                broken = await connection.read(listener.on_text, listener.on_audio)
                if broken is not None:
                    listener.errors.append(broken)
            finally:
                listener.closed = True
                listener.changed.set()

        async with asyncio.TaskGroup() as group:
            reader = group.create_task(read(), name="soak-reader")
            microphone = group.create_task(mic.run(), name="soak-microphone")
            try:
                for index, clip in enumerate(clips, 1):
                    turns.append(await one_turn(index, clip, listener, mic, quiet_s))
                    turns[-1].rss_mb = round(rss_mb(pid), 1) if pid else None
                    print(line(turns[-1]), file=sys.stderr, flush=True)
                    if listener.closed:
                        break
            finally:
                microphone.cancel()
                await connection.close()
                reader.cancel()
    return turns


async def one_turn(index: int, clip: Path, listener: Listener, mic: Microphone, quiet_s: float) -> SoakTurn:
    result = SoakTurn(index, clip.name)
    starts_before, errors_before = len(listener.speech_starts), len(listener.errors)
    mic.speak(float32_to_pcm16(load_audio_16k(clip)))
    await mic.idle.wait()
    if not await listener.wait_for(lambda: len(listener.speech_starts) > starts_before, 3.0):
        result.errors.append("no speech detected in this clip")
        return result
    # the clip's turn is the last one started while it played (a clip split in two is one turn of the soak)
    ended = await listener.wait_for(
        lambda: any(t in listener.turn_ends for t in listener.speech_starts[starts_before:][-1:]), TURN_TIMEOUT_S
    )
    started = listener.speech_starts[starts_before:]
    turn = started[-1]
    result.turn, result.turns_started = turn, len(started)
    if not ended:
        result.errors.append(f"no turn_end within {TURN_TIMEOUT_S:g} s")
        return result
    # the answer is heard to its end, then the user waits for a second of quiet before speaking again
    await listener.wait_for(lambda: turn in listener.audio_ended or turn not in listener.audio_bytes, TURN_TIMEOUT_S)
    await listener.wait_for(lambda: time.monotonic() - listener.last_audio_at >= quiet_s, TURN_TIMEOUT_S)
    end = listener.turn_ends[turn]
    stats, latency = end.get("stats", {}), end.get("latency_ms", {})
    result.transcript, result.answer = end.get("user_text", ""), end.get("answer", "")
    result.interrupted = bool(end.get("interrupted"))
    result.voice_to_voice_ms = latency.get("voice_to_voice")
    spoke, speech_end = listener.first_audio_at.get(turn), listener.speech_end_at.get(turn)
    if spoke is not None and speech_end is not None:
        result.client_voice_to_voice_ms = round((spoke - speech_end) * 1000, 1)
    prompt, encoded = stats.get("prompt_tokens"), stats.get("prompt_tokens_encoded")
    result.prompt_tokens = None if prompt is None else int(prompt)
    result.prompt_tokens_encoded = None if encoded is None else int(encoded)
    result.answer_words = len(result.answer.split())
    result.repeated_3gram_rate = round(repeated_ngram_rate(result.answer), 3)
    result.loop_3gram = has_ngram_loop(result.answer)
    result.non_words = non_words(result.answer)
    result.audio_s = round(listener.audio_bytes.get(turn, 0) / 2 / listener.output_rate, 2)
    result.late_messages = listener.late.get(turn, 0)
    result.errors.extend(listener.errors[errors_before:])
    result.in_step = (
        end.get("type") == "turn_end" and result.audio_s > 0 and result.late_messages == 0 and not result.errors
    )
    return result


def summarise(turns: list[SoakTurn], max_growth_mb: float, window: int = 10) -> dict[str, Any]:
    """The verdicts of issue 21 over a soak's turns."""

    def p50(rows: list[SoakTurn]) -> float | None:
        values = [t.voice_to_voice_ms for t in rows if t.voice_to_voice_ms is not None]
        return round(statistics.median(values), 1) if values else None

    first, last = p50(turns[:window]), p50(turns[-window:])
    ratio = round(last / first, 3) if first and last else None
    # Growth is the trend, not one sample: RSS read between turns still swings by the working set of a turn (one
    # soak: 1,035-1,329 MiB around a flat floor), so the medians of the first and last `window` turns after the
    # warm-up are compared; the peak is reported beside it.
    rss = [t.rss_mb for t in turns[WARMUP_TURNS - 1 :] if t.rss_mb is not None]
    growth = round(statistics.median(rss[-window:]) - statistics.median(rss[:window]), 1) if rss else None
    encoded = [t.prompt_tokens_encoded for t in turns if t.prompt_tokens_encoded is not None]
    return {
        "turns": len(turns),
        "answered_with_audio": sum(t.audio_s > 0 for t in turns),
        "in_step": sum(t.in_step for t in turns),
        "split_clips": sum(t.turns_started > 1 for t in turns),
        "late_messages": sum(t.late_messages for t in turns),
        "p50_first_ms": first,
        "p50_last_ms": last,
        "p50_last_over_first": ratio,
        "rss_mb_after_warmup": statistics.median(rss[:window]) if rss else None,
        "rss_mb_max_after_warmup": max(rss) if rss else None,
        "rss_growth_after_warmup_mb": growth,
        "growth_bound_mb": max_growth_mb,
        "prompt_tokens_encoded_median": statistics.median(encoded) if encoded else None,
        "prompt_tokens_encoded_max": max(encoded) if encoded else None,
        "answers_with_loop": sum(t.loop_3gram for t in turns),
        "answers_with_non_words": sum(bool(t.non_words) for t in turns),
        "verdicts": {
            "every_turn_answered_with_audio_and_in_step": all(t.in_step for t in turns),
            "p50_last_within_20_percent_of_first": ratio is not None and ratio <= 1.2,
            "memory_growth_within_bound": growth is not None and growth <= max_growth_mb,
            "no_loop_no_non_word": not any(t.loop_3gram or t.non_words for t in turns),
        },
    }


def line(t: SoakTurn) -> str:
    v2v = "–" if t.voice_to_voice_ms is None else f"{t.voice_to_voice_ms:.0f}"
    return (
        f"{t.index:>3} turn {t.turn} v2v {v2v} ms, prompt {t.prompt_tokens} (encoded {t.prompt_tokens_encoded}), "
        f"{t.answer_words} words, audio {t.audio_s} s, rss {t.rss_mb}, {'ok' if t.in_step else 'OUT OF STEP'}"
        f" {t.transcript[:40]!r} -> {t.answer[:60]!r}" + (f" {t.errors}" if t.errors else "")
    )


def table(turns: list[SoakTurn]) -> str:
    rows = [
        "| turn | heard | v2v (ms) | client v2v (ms) | prompt tok | encoded | words | rep-3gram | loop/non-word "
        "| audio (s) | in step | RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in turns:
        flag = "loop" if t.loop_3gram else ""
        flag += (" " if flag else "") + ",".join(t.non_words)
        rows.append(
            f"| {t.index} | {t.transcript[:32].replace('|', '/')} | {t.voice_to_voice_ms} | "
            f"{t.client_voice_to_voice_ms} | {t.prompt_tokens} | {t.prompt_tokens_encoded} | {t.answer_words} | "
            f"{t.repeated_3gram_rate:.2f} | {flag or '–'} | {t.audio_s} | {'yes' if t.in_step else 'NO'} | {t.rss_mb} |"
        )
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_target(parser)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--quiet-s", type=float, default=1.0, help="silence after an answer before the next turn")
    parser.add_argument("--max-growth-mb", type=float, default=150.0, help="allowed RSS growth after the warm-up")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--server-log", type=Path, default=Path("artifacts/soak_session_server.log"))
    parser.add_argument("--server-arg", action="append", default=[], help="extra argument for the spawned server")
    return parser


async def run(args: argparse.Namespace) -> dict[str, Any]:
    clips = soak_turns(args.turns)
    server: SpawnedServer | None = None
    url, pid = args.ws, pid_of(args.server_pid)
    if args.spawn:
        server = SpawnedServer(extra_args=args.server_arg, max_sessions=1)
        print("starting the server (loading models)...", file=sys.stderr, flush=True)
        await server.start(args.server_log)
        url, pid = server.url, server.pid
    try:
        started = time.monotonic()
        turns = await soak(url, clips, pid, args.quiet_s)
        wall_s = round(time.monotonic() - started, 1)
    finally:
        exit_code = await server.stop() if server is not None else None
    return {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_info(),
        "server": {"url": url, "pid": pid, "spawned": server is not None, "exit_code": exit_code},
        "wall_s": wall_s,
        "summary": summarise(turns, args.max_growth_mb),
        "turns": [asdict(t) for t in turns],
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if not 1 <= args.turns <= 500:
            raise LoadTestError("--turns must be 1..500")
        if args.ws:
            check_loopback(args.ws)
        result = asyncio.run(run(args))
    except (LoadTestError, ServerUnreachable) as err:
        print(f"soak_session: error: {err}", file=sys.stderr)
        return 2
    result["command"] = "python scripts/soak_session.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    turns = [SoakTurn(**t) for t in result["turns"]]
    print(table(turns))
    print_and_save(result["summary"], result, args.json, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
