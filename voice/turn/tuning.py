"""A client's tuning of one session's turn-taking (an OpenAI Realtime session's `turn_detection`), applied over the
server's configuration: the VAD's threshold, the silence that ends a speech segment, the audio kept before speech,
and how long the end-of-turn rule waits after a pause.

Its own module, below the session, because the session applies it to two parts it owns: the listener
(`ListenConfig`, voice/listen/) and the turn-taking machine (`TurnTakingConfig`, voice/turn/machine.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from voice.listen.stage import ListenConfig
from voice.turn.machine_config import TurnTakingConfig


@dataclass(frozen=True, slots=True)
class TurnTuning:
    """None keeps the server's setting. `patience` scales the end-of-turn rule's waits after a pause (after a
    complete, an incomplete, a question's verdict, and the silence rule without a verdict): 2 waits twice as long,
    0.5 half as long."""

    vad_threshold: float | None = None  # Silero's speech probability that opens speech (EndpointerConfig.threshold)
    silence_ms: int | None = None  # silence that closes a speech segment (EndpointerConfig.min_silence_ms)
    prefix_ms: int | None = None  # audio Whisper hears before the first voiced window (ListenConfig.lead_in_ms)
    patience: float = 1.0

    def filled(self, base: ListenConfig) -> TurnTuning:
        """This tuning with each value it leaves to the server filled in from `base` (what is in effect)."""
        ep = base.endpointer
        return TurnTuning(ep.threshold if self.vad_threshold is None else self.vad_threshold,
                          ep.min_silence_ms if self.silence_ms is None else self.silence_ms,
                          base.lead_in_ms if self.prefix_ms is None else self.prefix_ms, self.patience)

    def listen(self, base: ListenConfig) -> ListenConfig:
        """The listener's configuration with this tuning; raises ValueError for values the endpointer refuses."""
        endpointer = base.endpointer
        if self.vad_threshold is not None:
            endpointer = replace(endpointer, threshold=self.vad_threshold)
        if self.silence_ms is not None:  # the padding after speech must be in when the silence closes it
            endpointer = replace(endpointer, min_silence_ms=self.silence_ms,
                                 speech_pad_ms=min(endpointer.speech_pad_ms, self.silence_ms))
        lead_in = self.prefix_ms if self.prefix_ms is not None else base.lead_in_ms
        return replace(base, endpointer=endpointer, lead_in_ms=lead_in)

    def turn_taking(self, base: TurnTakingConfig) -> TurnTakingConfig:
        if self.patience == 1.0:
            return base
        p = self.patience
        return replace(base, complete_silence_ms=base.complete_silence_ms * p,
                       incomplete_silence_ms=base.incomplete_silence_ms * p,
                       question_silence_ms=base.question_silence_ms * p, silence_rule_ms=base.silence_rule_ms * p)
