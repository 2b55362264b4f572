"""Token-bucket rate limiting without I/O, for audio seconds and message counts on one connection.

A microphone produces audio in real time; a client that sends much faster is either broken or trying to make the server
transcribe for free. Short bursts are normal (a tab that was throttled in the background flushes its buffer), so the
bucket holds a burst allowance; beyond it frames are dropped with a notice, and a client that keeps flooding is closed.
The clock is an argument so tests drive time by hand.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Verdict(enum.Enum):
    ACCEPT = "accept"
    DROP = "drop"  # throttled: drop this frame, tell the client (see Decision.notify)
    CLOSE = "close"  # the client kept flooding past `close_after`: end the connection with a reason


@dataclass(frozen=True, slots=True)
class RateLimit:
    """`rate` units per second sustained, `burst` units of allowance, `close_after` units dropped before closing
    (`math.inf`: never close, only drop)."""

    rate: float
    burst: float
    close_after: float
    notify_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst <= 0 or self.close_after <= 0 or self.notify_interval_s < 0:
            raise ValueError(f"rate limit values must be positive: {self}")


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    notify: bool  # True at most once per notify_interval_s, so throttling notices cannot become a flood themselves


class TokenBucket:
    """Feed `take(cost, now)` for every frame; read a Decision."""

    def __init__(self, limit: RateLimit, now: float) -> None:
        self.limit = limit
        self._tokens = limit.burst
        self._updated = now
        self._last_notice: float | None = None
        self.dropped = 0.0  # units dropped over the connection's life
        self.accepted = 0.0

    def take(self, cost: float, now: float) -> Decision:
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        elapsed = max(0.0, now - self._updated)
        self._updated = max(self._updated, now)
        self._tokens = min(self.limit.burst, self._tokens + elapsed * self.limit.rate)
        if cost <= self._tokens:
            self._tokens -= cost
            self.accepted += cost
            return Decision(Verdict.ACCEPT, notify=False)
        self.dropped += cost
        if self.dropped > self.limit.close_after:
            return Decision(Verdict.CLOSE, notify=True)
        notify = self._last_notice is None or now - self._last_notice >= self.limit.notify_interval_s
        if notify:
            self._last_notice = now
        return Decision(Verdict.DROP, notify=notify)

    def wait_s(self, cost: float, now: float) -> float:
        """Seconds from `now` until `take(cost)` would be accepted (0 if it would be now), so a refusal can say when
        to try again."""
        if cost > self.limit.burst:
            return math.inf
        elapsed = max(0.0, now - self._updated)
        tokens = min(self.limit.burst, self._tokens + elapsed * self.limit.rate)
        return max(0.0, (cost - tokens) / self.limit.rate)
