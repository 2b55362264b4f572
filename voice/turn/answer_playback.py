"""How much of one answer's audio the listener has heard: what went out (the ledger of phrases and samples), when it
began, the pauses of a barge-in that may prove to be a cough, and the output's own report of what it played when it
sends one. The answer (voice/turn/answer.py) holds one; what was heard becomes the history (voice/turn/records.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from voice.events import now_ns
from voice.speak.playback_ledger import PlaybackLedger


@dataclass(slots=True)
class AnswerPlayback:
    """One answer's playback, pauses excluded."""

    ledger: PlaybackLedger = field(default_factory=PlaybackLedger)
    sample_rate: int = 0
    first_audio_ns: int | None = None
    reported_played: int | None = None  # exact playback position from the output, when it reports one
    unpaused: asyncio.Event = field(default_factory=asyncio.Event)  # clear while the outputs are paused
    paused_at_ns: int | None = None
    paused_ns: int = 0  # time spent paused before `paused_at_ns`
    pauses: int = 0

    def __post_init__(self) -> None:
        self.unpaused.set()

    def paused_ns_until(self, t_ns: int) -> int:
        """Time this answer's playback has spent paused up to `t_ns`."""
        return self.paused_ns + (t_ns - self.paused_at_ns if self.paused_at_ns is not None else 0)

    def pause(self, t_ns: int) -> bool:
        """The outputs stop playing this answer at `t_ns`; False if they already had."""
        if self.paused_at_ns is not None:
            return False
        self.paused_at_ns = t_ns
        self.pauses += 1
        self.unpaused.clear()
        return True

    def resume(self, t_ns: int) -> bool:
        """The outputs play on from where they stopped; False if they were not paused."""
        if self.paused_at_ns is None:
            return False
        self.paused_ns = self.paused_ns_until(t_ns)
        self.paused_at_ns = None
        self.unpaused.set()
        return True

    def played_estimate(self) -> int:
        """Samples the listener heard: the output's own report, else real time since the first sample went out, less
        the time playback was paused."""
        if self.reported_played is not None:
            return self.reported_played
        if self.first_audio_ns is None or not self.sample_rate:
            return 0
        now = now_ns()
        return int((now - self.first_audio_ns - self.paused_ns_until(now)) * self.sample_rate / 1e9)

    def playback_left(self) -> float:
        """Seconds until the audio handed out so far has played, assuming playback started with the first chunk."""
        if self.first_audio_ns is None or not self.sample_rate:
            return 0.0
        played = self.played_estimate()
        return max(0.0, (self.ledger.samples_out() - played) / self.sample_rate)
