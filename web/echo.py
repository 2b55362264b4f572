"""Server-side echo cancellation for one `/ws` client that asked for it (`hello` `"echo_cancellation": "server"`).

The thin shell between the connection and the canceller core (voice/listen/echo.py): it turns the session's events
(the audio sent, pauses, clears, resumes) and the client's `played` reports into the playback timeline's terms
(16 kHz samples on the microphone's clock), runs the client's microphone audio through the canceller before the
session hears it, and adds the canceller's figures to each turn's stats. No sockets, no tasks: the server calls it
from the tasks it already has, so it cannot fall behind the audio it cleans.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from voice import events as ev
from voice.audio import StreamResampler, float32_to_pcm16, pcm16_to_float32
from voice.listen.echo import EchoCanceller, EchoConfig
from voice.listen.playback_timeline import RATE

ECHO_RATE = RATE  # the cleaned microphone audio the session hears


class ServerEcho:
    """One connection's canceller: `mic` cleans what the client sends, `on_event` and `played` feed the reference."""

    def __init__(self, output_sample_rate: int, config: EchoConfig | None = None) -> None:
        self.canceller = EchoCanceller(config)
        self._output_rate = output_sample_rate
        self._mic_rate = RATE
        self._mic_resampler = StreamResampler(RATE)
        self._out_resamplers: dict[int, StreamResampler] = {}  # per turn: each turn's audio is one stream

    def mic(self, pcm16: bytes, sample_rate: int) -> bytes:
        """The client's microphone frame, at its rate, cancelled: PCM16 at 16 kHz (empty until 10 ms have come)."""
        if sample_rate != self._mic_rate:
            self._mic_rate, self._mic_resampler = sample_rate, StreamResampler(sample_rate)
        samples = self._mic_resampler.push(pcm16_to_float32(pcm16))
        return float32_to_pcm16(self.canceller.process(samples))

    def played(self, turn: int, samples: int) -> None:
        """The client's `played` report (samples at the output rate) as the timeline's anchor."""
        self.canceller.timeline.played(turn, samples * RATE // self._output_rate, self.canceller.heard_pos)

    def on_event(self, event: ev.Event) -> ev.Event:
        """Follow a session event on its way to the client; a turn's end comes back with the canceller's stats."""
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
