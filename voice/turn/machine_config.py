"""The turn-taking machine's settings (voice/turn/machine.py): its waits in milliseconds, the end-of-turn rule that
combines the detectors' verdicts, and the switches of file mode and half duplex. A client may retune a session's
(voice/turn/tuning.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from voice.end_of_turn import EndOfTurnRule


@dataclass(frozen=True, slots=True)
class TurnTakingConfig:
    """Timings in milliseconds. `explicit_end`: only `UserDone` confirms an end of turn (file mode: one file, one
    turn, whatever pauses it holds). `early_answer=False` starts the answer only once the end of turn is confirmed."""

    silence_rule_ms: float = 600.0  # no verdict (no turn detector): confirm after this much silence
    complete_silence_ms: float = 200.0  # the detector says complete
    # the detector says incomplete: wait this long before ending it anyway. Smart Turn hears 26 % of finished
    # utterances as unfinished (scripts/bench/bench_turn_detector.py), and each then waited this long: 1.5 s keeps
    # a thinking pause inside the turn and a misjudged question under 2 s (2 s put the load test's p95 at 2,000 ms)
    incomplete_silence_ms: float = 1500.0
    # ... unless Whisper wrote the words as a finished question (`asks_a_question`): a pause after a question mark
    # is rarely a thinking pause, and the misjudged questions were most of the holds in the latency report
    question_silence_ms: float = 800.0
    continuation_ms: float = 1200.0  # speech resuming this soon after the last voiced sample continues the turn
    # Wall clock: no audio for this long means the client stopped sending (a frame every 20-100 ms is normal)
    stalled_audio_ms: float = 1000.0
    # a sound paused the answer: play on once this much of it (on the audio clock) was decoded without a word ...
    # Whisper reads a voice that starts over the answer only from its first 0.7-0.9 s (the echo canceller holds its
    # first 100-300 ms down): at 600 ms the answer played on over the user for the moment before the words came
    resume_after_ms: float = 1000.0
    # ... or once this long (wall clock) passed since the pause, however far the recogniser got: a slow or busy one
    # (a decode of a barge-in's first words took 1-2 s on a loaded 2-core machine) holds the answer, never for long
    resume_limit_ms: float = 2000.0
    explicit_end: bool = False
    early_answer: bool = True
    # release the likely final's answer before the segment ends when the rule calls it complete (module docstring)
    release_on_likely_final: bool = True
    # How the detector's and the LM's probabilities combine (fitted: voice/end_of_turn.py); its waits are the ones above
    end_of_turn: EndOfTurnRule = field(default_factory=EndOfTurnRule)

    def __post_init__(self) -> None:
        durations = {
            "silence_rule_ms": self.silence_rule_ms, "complete_silence_ms": self.complete_silence_ms,
            "incomplete_silence_ms": self.incomplete_silence_ms, "question_silence_ms": self.question_silence_ms,
            "continuation_ms": self.continuation_ms, "stalled_audio_ms": self.stalled_audio_ms,
            "resume_after_ms": self.resume_after_ms, "resume_limit_ms": self.resume_limit_ms,
        }
        for name, value in durations.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0")
