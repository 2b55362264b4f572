"""A session's settings: one frozen dataclass, assembled from the CLI flags in one place (web/cli.py).

Its own module because the session shell and the answer it runs both read it, and neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.chat import GenerationOptions
from voice.listen.stage import ListenConfig
from voice.speak.speculator import SpeculatorConfig
from voice.think.dialogue import DialogueConfig
from voice.think.spoken import spoken_answer
from voice.tools.toolbox import ToolsConfig
from voice.turn.machine_config import TurnTakingConfig


@dataclass(frozen=True, slots=True)
class SessionConfig:
    listen: ListenConfig = field(default_factory=ListenConfig)
    speculator: SpeculatorConfig = field(default_factory=SpeculatorConfig)
    dialogue: DialogueConfig = field(default_factory=DialogueConfig)
    # Every answer's options, sent with every request whatever model answers it: a spoken answer's policy
    # (voice/think/spoken.py) by default, the system prompt (`--system-prompt`) and the logit rules.
    generation: GenerationOptions = field(default_factory=spoken_answer)
    # The tools the session runs for the model (voice/tools/): None, no tools (the commands turn the built-ins on
    # with `--tools`, and add `--mcp` servers)
    tools: ToolsConfig | None = None
    # `early_answer`: start the answer (LM, first phrase's TTS) at the pause, before the end of turn is sure
    turn_taking: TurnTakingConfig = field(default_factory=TurnTakingConfig)
    full_duplex: bool = True  # False (half duplex): microphone audio is ignored while the assistant speaks
    max_turn_seconds: float = 60.0
    # A turn ends when its audio has had time to play, not when the last chunk was handed out: a user who speaks
    # while the listener still hears the answer is barging in. File mode has no listener and turns this off.
    wait_for_playback: bool = True
    max_text_chars: int = 2000
    log_size: int = 5000  # events kept in `Session.log` (audio chunks excluded)
