"""Where the assistant's voice sits on the microphone's clock, without I/O: the echo canceller's reference.

A client without its own echo canceller plays the answer on open speakers and its microphone hears it again. To cancel
that echo the server must know, for each microphone sample, which sample of the answer the speaker was playing then.
It learns this from three things it already has:
- what it sent (`sent`): the turn's audio, in order, at 16 kHz;
- the client's `played` reports (`played`): "N samples of turn T have played", which arrive beside the microphone
  audio captured at the same moment, so the microphone sample count at arrival anchors sample N of the turn there;
- pauses, clears and resumes (`stopped`, `resumed`): the client stops playing where the report after a stop says.
Before a turn's first report (about 250 ms into its audio), the turn is placed by the earliest start the last turns'
reports showed relative to when their first audio went out, a little earlier still (`latency`), so the first words are
cancelled as well: a reference early is the canceller's to align, one late cannot cancel anything. A client that never
reports keeps that prediction for the whole turn. Whatever residual delay remains (the acoustic path,
the sound card's buffers) is the canceller's own delay estimator's to find; `reference` only has to be close.

All positions are in samples at 16 kHz: microphone positions count the samples the canceller has processed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

RATE = 16_000


@dataclass(frozen=True, slots=True)
class TimelineConfig:
    # a report this close to the current anchor leaves it (network jitter, rounding): the canceller's own delay
    # estimator takes a steady small error, while a reference that moves under it leaks echo until it re-aligns;
    # further away (an underrun, a clock that drifted) the report replaces the anchor
    jitter_samples: int = 480
    # until the report after a pause or clear arrives, the client is assumed to play on this long (the stop travels)
    stop_slack_samples: int = 4_000
    # a turn ended this long ago (in microphone samples) is forgotten: its echo tail has died away
    forget_after_samples: int = 16_000
    max_latency_samples: int = 32_000  # a learnt start latency is clamped to this (2 s): a report may be garbage
    # a new turn is placed this much earlier than the earliest start the last turns' reports showed: a reference that
    # comes early is the canceller's delay estimator's to find, one that comes late cannot be cancelled at all, and
    # the same link's start latency varies by tens of milliseconds (the event loops on both ends, the network)
    early_margin_samples: int = 480
    latency_memory: int = 4  # turns whose learnt start latency the prediction takes the minimum of
    # how long after a sample plays its echo may still be heard (the acoustic path plus a room's tail, 0.5 s)
    echo_tail_samples: int = 8_000


@dataclass(slots=True)
class _TurnAudio:
    """One turn's reference: its samples and where sample 0 sits on the microphone clock."""

    first_sent_at: int  # microphone position when its first audio went out
    offset: int  # microphone position of the turn's sample 0
    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    anchored: bool = False  # `offset` came from a played report (else predicted)
    stopped_at: int | None = None  # microphone position of the pause or clear, until the client's report lands
    end: int | None = None  # samples of the turn played at most (after a stop); None while it plays on

    def played_end(self) -> int:
        """The last turn sample that can be playing: its end, or what it has, once stopped where the client stopped."""
        limit = len(self.samples)
        if self.end is not None:
            return min(limit, self.end)
        if self.stopped_at is not None:
            return min(limit, max(0, self.stopped_at - self.offset))
        return limit


class PlaybackTimeline:
    """The reference the echo canceller subtracts: feed what was sent and what the client reported, ask `reference`."""

    def __init__(self, config: TimelineConfig | None = None) -> None:
        self.config = config or TimelineConfig()
        self.latency = 0  # predicted: a new turn's sample 0 plays this many samples after its first audio went out
        self._learnt: list[int] = []  # the last turns' measured start latencies
        self._turns: dict[int, _TurnAudio] = {}
        self.reports = 0  # played reports that anchored a turn

    def sent(self, turn: int, samples: np.ndarray, mic_pos: int) -> None:
        """Audio of `turn` (16 kHz float32) went out to the client while the microphone stood at `mic_pos`."""
        audio = self._turns.get(turn)
        if audio is None:
            audio = self._turns[turn] = _TurnAudio(first_sent_at=mic_pos, offset=mic_pos + self.latency)
        audio.samples = np.concatenate([audio.samples, np.asarray(samples, np.float32)])

    def played(self, turn: int, played_samples: int, mic_pos: int) -> None:
        """The client says `played_samples` (16 kHz) of `turn` have played; its report arrived at `mic_pos`."""
        audio = self._turns.get(turn)
        if audio is None:
            return
        if audio.stopped_at is not None:  # the report after a pause or clear: where playback really stopped
            audio.end = played_samples
            audio.stopped_at = None
            return
        if audio.end is not None:  # a resumed turn plays on past its old end
            audio.end = None
        new_offset = mic_pos - played_samples
        if not audio.anchored:
            self._learn(new_offset - audio.first_sent_at)
        if not audio.anchored or abs(new_offset - audio.offset) > self.config.jitter_samples:
            audio.offset = new_offset
        audio.anchored = True
        self.reports += 1

    def _learn(self, latency: int) -> None:
        config = self.config
        self._learnt = [*self._learnt, int(np.clip(latency, 0, config.max_latency_samples))][-config.latency_memory :]
        self.latency = max(0, min(self._learnt) - config.early_margin_samples)

    def stopped(self, turn: int, mic_pos: int) -> None:
        """The server told the client to pause or clear `turn` while the microphone stood at `mic_pos`."""
        audio = self._turns.get(turn)
        if audio is not None and audio.stopped_at is None:
            audio.stopped_at = mic_pos + self.config.stop_slack_samples

    def resumed(self, turn: int, mic_pos: int) -> None:
        """The server told the client to resume `turn`: it plays on from where it stopped, about `latency` later."""
        audio = self._turns.get(turn)
        if audio is None:
            return
        resume_from = audio.played_end()
        audio.stopped_at = None
        audio.end = None
        audio.offset = mic_pos + self.latency - resume_from

    def reference(self, mic_start: int, count: int) -> np.ndarray:
        """What the speaker played for microphone samples [mic_start, mic_start + count): zeros where nothing played."""
        out = np.zeros(count, np.float32)
        for turn in list(self._turns):
            audio = self._turns[turn]
            end = audio.played_end()
            if audio.offset + end + self.config.forget_after_samples < mic_start:
                del self._turns[turn]
                continue
            first = max(0, mic_start - audio.offset)
            last = min(end, mic_start + count - audio.offset)
            if last > first:
                at = audio.offset + first - mic_start
                out[at : at + last - first] += audio.samples[first:last]
        return out

    def playing(self, mic_start: int, count: int) -> bool:
        """Whether any assistant audio may be playing during these microphone samples (the half-duplex fallback)."""
        for audio in self._turns.values():
            start, end = audio.offset, audio.offset + audio.played_end() + self.config.stop_slack_samples
            if start < mic_start + count and end > mic_start:
                return True
        return False
