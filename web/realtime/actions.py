"""What the Realtime protocol core asks its shell to do: send a server event, or call the voice session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from voice.tools.loop import ClientTools
from voice.turn.tuning import TurnTuning


@dataclass(frozen=True, slots=True)
class Send:
    """A server event to send to the client."""

    event: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FeedAudio:
    pcm: bytes
    sample_rate: int


@dataclass(frozen=True, slots=True)
class EndAudio:
    """The user's audio ends here: the session closes the utterance and ends the turn."""


@dataclass(frozen=True, slots=True)
class SendText:
    text: str


@dataclass(frozen=True, slots=True)
class Interrupt:
    pass


@dataclass(frozen=True, slots=True)
class TruncateHeard:
    """The client played only the first `samples` (at the session's output rate) of `turn`'s answer."""

    samples: int
    turn: int


@dataclass(frozen=True, slots=True)
class SetInstructions:
    text: str | None  # None: the session's own system prompt


@dataclass(frozen=True, slots=True)
class TuneTurns:
    """The listener's and the end-of-turn rule's tuning from the session's turn_detection (`Session.tune_turns`)."""

    tuning: TurnTuning


@dataclass(frozen=True, slots=True)
class SetTools:
    """The client's own functions and its tool choice, for the answers from now on (`Session.set_client_tools`)."""

    tools: ClientTools


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """The result of the client's run of call `call_id` (`Session.add_tool_result`)."""

    call_id: str
    output: str


@dataclass(frozen=True, slots=True)
class AnswerToolResults:
    """Answer the tool results the client returned, with no new user words (`Session.answer_tool_results`)."""


Action = (Send | FeedAudio | EndAudio | SendText | Interrupt | TruncateHeard | SetInstructions | TuneTurns
          | SetTools | ToolOutput | AnswerToolResults)
