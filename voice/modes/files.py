"""File mode: each WAV file is one user turn through the same `Session` a microphone would drive.

Audio is streamed in 20 ms chunks (paced in real time with `realtime=True`, so the streaming ASR, the endpointer and
the speculative end of turn behave as they would live), followed by trailing silence so the endpointer closes the
turn. The
assistant's audio of every turn is collected into one WAV; each turn's transcript, answer and latency breakdown are
returned (and written as JSON by the CLI).
"""

from __future__ import annotations

import asyncio
import json
import wave
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from voice.audio import TARGET_RATE, float32_to_pcm16, load_audio_16k, stream_pcm16
from voice.engines import Engines
from voice.events import AudioOut, ErrorEvent, Event, TurnEnd, now_ns
from voice.turn.session import Session, SessionConfig

TRAILING_SILENCE_S = 1.2  # longer than the endpointer's minimum silence plus padding


@dataclass(slots=True)
class FileTurn:
    source: str
    transcript: str = ""
    answer: str = ""
    spoken: str = ""
    latency_ms: dict[str, float] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "transcript": self.transcript,
            "answer": self.answer,
            "spoken": self.spoken,
            "latency_ms": self.latency_ms,
            "stats": self.stats,
            "errors": self.errors,
        }


@dataclass(slots=True)
class FileRunResult:
    turns: list[FileTurn]
    audio: list[bytes]  # PCM16 of the assistant, all turns in order
    sample_rate: int
    events: list[Event]


async def run_files(
    engines: Engines,
    paths: list[Path],
    config: SessionConfig | None = None,
    realtime: bool = False,
    session: Session | None = None,
) -> FileRunResult:
    """Run each file as one spoken user turn, in order, in one conversation.

    A file is one turn whatever pauses it holds: the session's end of turn is explicit (`user_done` once the file's
    audio is in), so a pause inside a file only drops a speculative answer and the next segment continues the turn.
    The next file starts once this one's turn has ended, answer and all.
    """
    own_session = session is None
    if session is None:
        base = config or SessionConfig()
        session = Session(engines, replace(base, wait_for_playback=False,
                                           turn_taking=replace(base.turn_taking, explicit_end=True)))
    await session.start()
    audio: list[bytes] = []
    events: list[Event] = []

    async def collect() -> None:
        async for event in session.events():
            if isinstance(event, AudioOut):
                audio.append(event.pcm)
            else:
                events.append(event)

    collector = asyncio.create_task(collect(), name=f"file-mode-collect-{session.id}")
    turns: list[FileTurn] = []
    try:
        for path in paths:
            turn = FileTurn(str(path))
            turns.append(turn)
            samples = load_audio_16k(path)  # AudioFormatError for anything that is not audio
            silence = np.zeros(int(TRAILING_SILENCE_S * TARGET_RATE), dtype=np.float32)
            began = now_ns()
            feed = lambda frame: session.feed_audio(frame, TARGET_RATE)  # noqa: E731
            await stream_pcm16(feed, float32_to_pcm16(samples), realtime=realtime)
            await session.user_done()  # the file's speech is all in: its last pause ends the turn
            await stream_pcm16(feed, float32_to_pcm16(silence), realtime=realtime)
            await session.end_of_audio()
            async with asyncio.timeout(session.config.max_turn_seconds + 30.0):
                await session.wait_idle()
            mine = [e for e in session.log if e.t_ns >= began and isinstance(e, TurnEnd | ErrorEvent)]
            end = next((e for e in mine if isinstance(e, TurnEnd)), None)
            if end is not None:
                turn.transcript, turn.answer, turn.spoken = end.user_text, end.answer, end.spoken
                turn.latency_ms, turn.stats = dict(end.latency_ms), dict(end.stats)
            turn.errors = [f"{e.code}: {e.message}" for e in mine if isinstance(e, ErrorEvent)]
    finally:
        if own_session:
            await session.close()
            await collector
        else:
            collector.cancel()
    return FileRunResult(turns, audio, engines.tts.sample_rate, events)


def write_wav(path: Path, chunks: list[bytes], sample_rate: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(b"".join(chunks))


def write_turns_json(path: Path, result: FileRunResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([turn.to_json() for turn in result.turns], indent=2) + "\n")
