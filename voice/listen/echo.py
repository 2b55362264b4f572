"""Acoustic echo cancellation of the assistant's own voice, without I/O: feed the reference, feed the microphone,
read the cleaned microphone.

The canceller is WebRTC's audio processing module (AEC3 with its high-pass filter and noise suppression) through
`pywebrtc-audio`: the canceller of every browser, maintained, with its own delay estimator, so the reference only has
to be roughly aligned (voice/listen/playback_timeline.py places it from what the client reports having played).
Chosen by measurement over speexdsp and LiveKit's build of the same module (scripts/bench/bench_echo.py and the
README's "Talking over open speakers"): on real speech through a simulated room (120 ms, a decaying tail, echo at -8
dB) AEC3 removed 23 dB of echo (34 dB with its noise suppression) against speexdsp's 15-19 dB, kept a different
talker's words during double talk, and costs ~0.15 ms of one core per 10 ms frame; LiveKit's `AudioProcessingModule`
wraps the same AEC3 (same figures) behind a 28 MB runtime with its own threads.

Frames are 10 ms at 16 kHz, AEC3's own frame. A canceller that cannot keep up (its frames take longer than the
budget on average) falls back to half duplex for the rest of the session: the microphone is muted while the
assistant's voice may be playing, as without a canceller, and `stats` says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pywebrtc_audio import AudioProcessor

from voice.listen.playback_timeline import RATE, PlaybackTimeline, TimelineConfig

FRAME = RATE // 100  # AEC3 works on 10 ms frames


@dataclass(frozen=True, slots=True)
class EchoConfig:
    noise_suppression: bool = True  # AEC3's noise suppressor also takes the residual echo the linear filter leaves
    # mean CPU seconds per 10 ms frame over `budget_frames` frames past which the canceller is not keeping up (a
    # machine too slow for it): 0.15 ms is typical on one core of the 2-core CI machine, so 5 ms is thirty times that
    frame_budget_s: float = 0.005
    budget_frames: int = 100
    timeline: TimelineConfig = field(default_factory=TimelineConfig)


class EchoCanceller:
    """One client's echo canceller: `reference` (via `timeline`) in, `process(mic)` out, both at 16 kHz float32."""

    # the canceller's own CPU time, not the wall clock: a thread that waits for a core (a busy machine, the LM's
    # threads) has not fallen behind by its own cost, and muting the microphone would not give that core back
    def __init__(self, config: EchoConfig | None = None, clock: Callable[[], float] = time.thread_time) -> None:
        self.config = config = config or EchoConfig()
        self.timeline = PlaybackTimeline(config.timeline)
        self._apm = AudioProcessor(sample_rate=RATE, echo_cancellation=True, high_pass_filter=True,
                                   noise_suppression=config.noise_suppression)
        self._clock = clock
        self._pending = np.zeros(0, np.float32)
        self.mic_pos = 0  # microphone samples processed: the timeline's clock
        self.half_duplex = False  # the canceller fell behind: mute while the assistant may be playing
        self.frames = 0
        self.reference_frames = 0  # frames while the assistant's voice played (the reference was not silent)
        self._spent_s = 0.0  # total seconds spent in AEC3
        self._window_s = 0.0  # seconds spent over the current budget window
        self._echo_in = 0.0  # microphone energy while a reference played, and what was left of it
        self._echo_out = 0.0

    @property
    def heard_pos(self) -> int:
        """Microphone samples received so far, the shorter remainder awaiting its frame included: the position a
        client's report or a sent answer is placed at (`mic_pos` alone lags it by up to a frame, unevenly, and a
        reference that moves by those few samples from report to report leaked echo while AEC3 re-aligned)."""
        return self.mic_pos + len(self._pending)

    def process(self, mic: np.ndarray) -> np.ndarray:
        """Cancel the assistant's voice from the next microphone samples; returns the cleaned samples of every whole
        10 ms frame now available (a shorter remainder waits for the next call)."""
        pending = np.concatenate([self._pending, np.asarray(mic, np.float32)])
        whole = len(pending) - len(pending) % FRAME
        self._pending = pending[whole:]
        out = np.empty(whole, np.float32)
        for at in range(0, whole, FRAME):
            out[at : at + FRAME] = self._frame(pending[at : at + FRAME])
        return out

    def _frame(self, near: np.ndarray) -> np.ndarray:
        far = self.timeline.reference(self.mic_pos, FRAME)
        if self.half_duplex:
            playing = self.timeline.playing(self.mic_pos, FRAME)
            self.mic_pos += FRAME
            return np.zeros(FRAME, np.float32) if playing else near
        started = self._clock()
        cleaned = self._apm.process(near, far)
        spent = self._clock() - started
        self.mic_pos += FRAME
        self.frames += 1
        self._spent_s += spent
        self._window_s += spent
        if self.frames % self.config.budget_frames == 0:
            if self._window_s / self.config.budget_frames > self.config.frame_budget_s:
                self.half_duplex = True
            self._window_s = 0.0
        if np.any(far):
            self.reference_frames += 1
            self._echo_in += float(np.dot(near, near))
            self._echo_out += float(np.dot(cleaned, cleaned))
        return cleaned

    @property
    def reference_s(self) -> float:
        """Seconds of the assistant's voice the canceller has heard."""
        return self.reference_frames * FRAME / RATE

    def stats(self) -> dict[str, float]:
        """What a turn's stats say of the canceller: its mode, its cost per 10 ms frame, and the echo it removed
        (microphone energy over what was left, while a reference played: double talk lowers it)."""
        stats = {"echo_half_duplex": float(self.half_duplex),
                 "echo_ms_per_frame": 1000 * self._spent_s / self.frames if self.frames else 0.0}
        if self._echo_in > 0 and self._echo_out > 0:
            stats["echo_erle_db"] = 10 * float(np.log10(self._echo_in / self._echo_out))
        return stats
