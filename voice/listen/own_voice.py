"""The assistant's own voice cancelled from a microphone, following the session's events: the thin shell between a
voice session and the canceller core (voice/listen/echo.py), shared by `/ws` clients that ask for it (`hello`
`"echo_cancellation": "server"`) and by local mode on open speakers.

It turns the session's events (the audio sent, pauses, clears, resumes) and the playback reports into the playback
timeline's terms (16 kHz samples on the microphone's clock), runs the microphone audio through the canceller before the
session hears it, and adds the canceller's figures to each turn's stats. The two callers differ only in where a
playback report sits on the microphone's clock: a `/ws` client's `played` report arrives beside the microphone audio
captured at the same moment (`played` with no position: the samples heard so far), while local mode knows when each
speaker block reaches the DAC and each microphone block left the ADC on PortAudio's clock (`mic(captured_at=...)` and
`position_at`). No sockets, no tasks, no threads: the callers run it from the tasks they already have, so it cannot
fall behind the audio it cleans.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from voice import events as ev
from voice.audio import StreamResampler, float32_to_pcm16, pcm16_to_float32
from voice.listen.echo import EchoCanceller, EchoConfig
from voice.listen.playback_timeline import RATE

ECHO_RATE = RATE  # the cleaned microphone audio the session hears


class OwnVoice:
    """One conversation's canceller: `mic` cleans the microphone, `on_event` and `played` feed the reference."""

    def __init__(self, output_sample_rate: int, config: EchoConfig | None = None) -> None:
        self.canceller = EchoCanceller(config)
        self._output_rate = output_sample_rate
        self._mic_rate = RATE
        self._mic_resampler = StreamResampler(RATE)
        self._out_resamplers: dict[int, StreamResampler] = {}  # per turn: each turn's audio is one stream
        self._clock: tuple[float, int] | None = None  # (capture time of the last microphone block, its position)

    def mic(self, pcm16: bytes, sample_rate: int, captured_at: float | None = None) -> bytes:
        """A microphone block at its rate, cancelled: PCM16 at 16 kHz (empty until 10 ms have come). `captured_at`:
        when its first sample was captured, on the clock `position_at` is asked in (local mode's ADC time)."""
        if sample_rate != self._mic_rate:
            self._mic_rate, self._mic_resampler = sample_rate, StreamResampler(sample_rate)
        if captured_at is not None and captured_at > 0:
            self._clock = (captured_at, self.canceller.heard_pos)
        samples = self._mic_resampler.push(pcm16_to_float32(pcm16))
        return float32_to_pcm16(self.canceller.process(samples))

    def position_at(self, when: float) -> int | None:
        """The microphone position (16 kHz samples) captured at `when`, from the last block's capture time; None
        before any block came with one."""
        if self._clock is None:
            return None
        captured_at, position = self._clock
        return position + round((when - captured_at) * RATE)

    def played(self, turn: int, samples: int, at: int | None = None) -> None:
        """`samples` (at the output rate) of `turn` have played, and the next one plays at microphone position `at`
        (default: the samples heard so far, a `/ws` client's report arriving beside its microphone audio)."""
        position = self.canceller.heard_pos if at is None else at
        self.canceller.timeline.played(turn, samples * RATE // self._output_rate, position)

    def on_event(self, event: ev.Event) -> ev.Event:
        """Follow a session event on its way to the speaker; a turn's end comes back with the canceller's stats."""
        timeline, mic_pos = self.canceller.timeline, self.canceller.heard_pos
        match event:
            case ev.AudioOut(turn=turn, pcm=pcm, sample_rate=rate):
                resampler = self._out_resamplers.setdefault(turn, StreamResampler(rate, RATE))
                timeline.sent(turn, resampler.push(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768), mic_pos)
            case ev.Pause(turn=turn) | ev.Clear(turn=turn):
                timeline.stopped(turn, mic_pos)
            case ev.Resume(turn=turn):
                timeline.resumed(turn, mic_pos)
            case ev.TurnEnd(turn=turn):
                self._out_resamplers.pop(turn, None)
                return replace(event, stats={**event.stats, **self.canceller.stats()})
        return event

    @property
    def half_duplex(self) -> bool:
        """The canceller could not keep up and mutes the microphone while the voice may be playing."""
        return self.canceller.half_duplex
