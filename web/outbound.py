"""What the server sends each client, in which order and when, without I/O: a bounded queue with two lanes.

The TTS renders faster than real time, so an answer's audio is ready long before it is heard. Sent unpaced, seconds of
it would sit in the socket's buffers on a slow link and a `clear` (barge-in) would wait behind them. So:
- control messages (everything JSON except the audio markers) go first, as soon as the socket takes them;
- the audio lane (`audio_start`, PCM frames, `audio_end`, in order) is paced: a frame goes out only while the client
  holds less than `lead_s` of unplayed audio, counting from when the turn's audio began;
- `clear` drops every queued audio item of its turn (and earlier turns) and refuses that turn's later audio, so no
  audio of a cleared turn is sent after the `clear`;
- `pause` (the user made a sound that may be a barge-in) holds the audio lane and stops its pacing clock until the
  turn's `resume` (or `clear`): the client pauses what it holds, and nothing more is sent meanwhile;
- both lanes are bounded: control by count (a client that reads nothing is closed), audio by seconds (the rest of an
  overlong answer is dropped with one `error`).
The server's sender task asks `pop(now)` for the next frame, and when it gets none, sleeps `wait_s(now)` or until
something is pushed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from web.protocol import LimitExceeded


@dataclass(frozen=True, slots=True)
class OutboundLimits:
    max_control_messages: int = 1_000
    max_audio_s: float = 60.0
    lead_s: float = 1.0  # audio the client may hold beyond what has played: covers Wi-Fi jitter, small enough to stop

    def __post_init__(self) -> None:
        if self.max_control_messages <= 0 or self.max_audio_s <= 0 or self.lead_s < 0:
            raise ValueError(f"outbound limits must be positive: {self}")


class ClientTooSlow(LimitExceeded):
    """The client has not read its control messages for so long that the bounded queue is full."""


@dataclass(frozen=True, slots=True)
class _AudioItem:
    turn: int
    frame: str | bytes
    seconds: float = 0.0  # playing time of a PCM frame; 0 for the markers
    start_rate: int | None = None  # the sample rate an `audio_start` announces


class OutboundQueue:
    """Push frames as the session produces them; pop them in the order and at the pace a client should get them."""

    def __init__(self, limits: OutboundLimits, sample_rate: int) -> None:
        self.limits = limits
        self._control: deque[str] = deque()
        self._audio: deque[_AudioItem] = deque()
        self._audio_s = 0.0
        self._rate = sample_rate
        self._cleared_up_to = 0  # turns <= this were cleared: their audio is never sent
        self._overflowed_turn: int | None = None
        self._turn_started: float | None = None  # when the audio in flight began, adjusted for gaps
        self._turn_sent_s = 0.0  # seconds of audio sent since then
        self._paused: tuple[int, float] | None = None  # (turn, since when) while the client's playback is paused
        self.dropped_audio_s = 0.0

    # --- producer side -----------------------------------------------------------------------------------------------
    def push_control(self, frame: str) -> None:
        if len(self._control) >= self.limits.max_control_messages:
            raise ClientTooSlow(f"the client is not reading: {len(self._control)} messages are waiting")
        self._control.append(frame)

    def push_clear(self, frame: str, turn: int) -> None:
        """A `clear` for `turn`: it jumps ahead of all audio, which is dropped for that turn and earlier ones."""
        self._cleared_up_to = max(self._cleared_up_to, turn)
        kept = deque(item for item in self._audio if item.turn > turn)
        self.dropped_audio_s += self._audio_s - sum(item.seconds for item in kept)
        self._audio = kept
        self._audio_s = sum(item.seconds for item in kept)
        self._turn_started = None
        if self._paused is not None and self._paused[0] <= turn:
            self._paused = None
        self.push_control(frame)

    def push_pause(self, frame: str, turn: int, now: float) -> None:
        """A `pause` for `turn`: it goes ahead of all audio, and no audio follows until that turn's `resume`."""
        if turn > self._cleared_up_to and self._paused is None:
            self._paused = (turn, now)
        self.push_control(frame)

    def push_resume(self, frame: str, turn: int, now: float) -> None:
        """A `resume` for `turn`: the audio lane goes on where it stopped, its pacing clock shifted by the pause."""
        if self._paused is not None and self._paused[0] == turn:
            if self._turn_started is not None:
                self._turn_started += now - self._paused[1]
            self._paused = None
        self.push_control(frame)

    def push_audio_marker(self, frame: str, turn: int, start_rate: int | None = None) -> None:
        """`audio_start` (with its rate) or `audio_end`: they travel in the audio lane, in order with the PCM."""
        if turn > self._cleared_up_to:
            self._audio.append(_AudioItem(turn, frame, start_rate=start_rate))

    def push_audio(self, pcm: bytes, turn: int) -> LimitExceeded | None:
        """Queue a PCM frame; returns an error to tell the client (once per turn) when the lane is over its bound."""
        if turn <= self._cleared_up_to:
            return None
        seconds = len(pcm) / 2 / self._rate
        if self._audio_s + seconds > self.limits.max_audio_s:
            self.dropped_audio_s += seconds
            if self._overflowed_turn == turn:
                return None
            self._overflowed_turn = turn
            return LimitExceeded(
                f"more than {self.limits.max_audio_s:g} s of speech waiting to be sent; the rest of "
                "this answer is dropped"
            )
        self._audio.append(_AudioItem(turn, pcm, seconds))
        self._audio_s += seconds
        return None

    # --- sender side -------------------------------------------------------------------------------------------------
    def pop(self, now: float) -> str | bytes | None:
        """The next frame to send now, or None (nothing queued, or the audio must wait: see `wait_s`)."""
        if self._control:
            return self._control.popleft()
        if not self._audio or self.wait_s(now) > 0:
            return None
        item = self._audio.popleft()
        if item.start_rate is not None:
            self._rate = item.start_rate
            self._turn_started, self._turn_sent_s = now, 0.0
        if item.seconds:
            self._audio_s -= item.seconds
            if self._turn_started is None or now > self._turn_started + self._turn_sent_s:
                # the client's buffer ran dry (the TTS fell behind): its playback restarts with this frame
                self._turn_started = now - self._turn_sent_s
            self._turn_sent_s += item.seconds
        return item.frame

    def wait_s(self, now: float) -> float:
        """Seconds until the next audio frame may go (0: now); infinity when there is nothing to send."""
        if self._control:
            return 0.0
        if not self._audio or self._paused is not None:
            return float("inf")
        if not self._audio[0].seconds or self._turn_started is None:
            return 0.0
        ahead = self._turn_sent_s - (now - self._turn_started)
        return max(0.0, ahead - self.limits.lead_s)

    @property
    def queued_audio_s(self) -> float:
        return self._audio_s

    @property
    def queued_control(self) -> int:
        return len(self._control)

    def has_pending(self) -> bool:
        """Whether anything still waits to be sent (a control message or speech)."""
        return bool(self._control or self._audio)
