"""File mode: each WAV file is one user turn through the same `Session` a microphone would drive.

Audio is streamed in 20 ms chunks (paced in real time with `realtime=True`, so the streaming ASR, the endpointer and
the early LM start behave as they would live), followed by trailing silence so the endpointer closes the turn. The
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

from voice.engines import Engines
from voice.events import AudioOut, ErrorEvent, Event, SpeechStart, Transcript, TurnEnd
from voice.io.audio import TARGET_RATE, float32_to_pcm16, load_audio_16k, stream_pcm16
from voice.session import Session, SessionConfig

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
    """Run each file as one spoken user turn, in order, in one conversation."""
    own_session = session is None
    session = session or Session(engines, replace(config or SessionConfig(), wait_for_playback=False))
    await session.start()
    audio: list[bytes] = []
    events: list[Event] = []
    ended: asyncio.Queue[TurnEnd | None] = asyncio.Queue()  # None: the utterance had no words, so no turn

    async def collect() -> None:
        async for event in session.events():
            if isinstance(event, AudioOut):
                audio.append(event.pcm)
                continue
            events.append(event)
            if isinstance(event, TurnEnd):
                ended.put_nowait(event)
            elif isinstance(event, Transcript) and event.final and not event.text.strip():
                ended.put_nowait(None)

    collector = asyncio.create_task(collect(), name=f"file-mode-collect-{session.id}")
    turns: list[FileTurn] = []
    try:
        for path in paths:
            turn = FileTurn(str(path))
            turns.append(turn)
            samples = load_audio_16k(path)  # AudioFormatError for anything that is not audio
            silence = np.zeros(int(TRAILING_SILENCE_S * TARGET_RATE), dtype=np.float32)
            first_event = len(events)
            pcm = float32_to_pcm16(np.concatenate([samples, silence]))
            await stream_pcm16(lambda frame: session.feed_audio(frame, TARGET_RATE), pcm, realtime=realtime)
            await session.end_of_audio()
            heard_speech = any(isinstance(e, SpeechStart) for e in events[first_event:])
            # a spoken turn always ends with TurnEnd (answer, error or timeout); silence or noise never starts one
            wait = session.config.max_turn_seconds + 30.0 if heard_speech else 1.0
            end = await _next_turn_end(ended, wait)
            if end is not None:
                turn.transcript, turn.answer, turn.spoken = end.user_text, end.answer, end.spoken
                turn.latency_ms, turn.stats = dict(end.latency_ms), dict(end.stats)
            turn.errors = [f"{e.code}: {e.message}" for e in events[first_event:] if isinstance(e, ErrorEvent)]
    finally:
        if own_session:
            await session.close()
            await collector
        else:
            collector.cancel()
    return FileRunResult(turns, audio, engines.tts.sample_rate, events)


async def _next_turn_end(ended: asyncio.Queue[TurnEnd | None], wait_s: float) -> TurnEnd | None:
    """The TurnEnd of the file just streamed, or None when it produced no turn (silence, or only noise)."""
    try:
        async with asyncio.timeout(wait_s):
            return await ended.get()
    except TimeoutError:
        return None


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
