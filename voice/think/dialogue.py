"""Chat history for one conversation: a system prompt suited to speech and a context budget.

No I/O. The session appends what the user said and what the assistant *actually said* (after barge-in, only the phrases
whose audio was played), and asks for the messages to send to the model. When the history outgrows the budget the
oldest exchanges are dropped first, always keeping the system prompt and the newest user message.

History is dropped in large steps, not one exchange a turn. The LM keeps its KV cache between answers and encodes only
what the new prompt does not share with the last one; dropping the oldest exchange every turn shifts the whole history
and forces a re-encoding of all of it every turn (measured: scripts/bench/bench_dialogue.py). Once the history outgrows
`context_chars`, the oldest messages go until at most `keep_after_drop` of the budget remains; the prompt then grows
turn by turn on top of a cached prefix until the budget is reached again. The window is a pure function of the history,
so a copy of the dialogue (the session's early LM start) sends exactly the prompt the real one would.

The model also sees at most `max_exchanges` earlier exchanges (1 by default). The bundled 135M model copies its own
earlier answers: with the whole budget of history its answers decayed within a few turns into copies of an earlier
one ("A cat's a cat. A cat's name is a cat's." to every question from turn 7 on, in self-speculative decoding, which
says exactly what the base model says) or "X is a X" loops (diffusion decoding); with the previous exchange only it
answered the questions (scripts/bench/bench_dialogue.py --history full|last). One exchange keeps what a follow-up needs
("What is my name?" after "My name is Alice."); a capable remote model can be given more (`None`: the budget only).
"""

from __future__ import annotations

from dataclasses import dataclass

from model.chat import ChatMessage


@dataclass(frozen=True, slots=True)
class DialogueConfig:
    context_chars: int = 2400  # about 600 tokens: the bundled model's answers degrade on long contexts
    max_user_chars: int = 2000  # longer user input is cut (typed text can be arbitrarily long)
    keep_after_drop: float = 0.5  # share of the budget left after a drop: lower drops more, less often
    max_exchanges: int | None = 1  # earlier user/assistant exchanges the model sees (None: as many as the budget holds)

    def __post_init__(self) -> None:
        if self.context_chars < 1:
            raise ValueError(f"context_chars must be at least 1, got {self.context_chars}")
        if not 0.0 <= self.keep_after_drop <= 1.0:
            raise ValueError(f"keep_after_drop must be between 0 and 1, got {self.keep_after_drop}")
        if self.max_exchanges is not None and self.max_exchanges < 0:
            raise ValueError(f"max_exchanges must be >= 0 or None, got {self.max_exchanges}")


class Dialogue:
    """The running conversation. `messages()` is what the model sees for the next answer."""

    def __init__(self, config: DialogueConfig | None = None, history: tuple[ChatMessage, ...] = ()) -> None:
        self.config = config or DialogueConfig()
        self._turns: list[ChatMessage] = list(history)

    @property
    def history(self) -> tuple[ChatMessage, ...]:
        return tuple(self._turns)

    def add_user(self, text: str) -> None:
        text = text.strip()[: self.config.max_user_chars]
        if self._turns and self._turns[-1].role == "user":
            # The user kept talking before the assistant said anything: one message, not two in a row.
            text = f"{self._turns[-1].content} {text}".strip()
            self._turns[-1] = ChatMessage("user", text)
        else:
            self._turns.append(ChatMessage("user", text))

    def add_tool_messages(self, messages: list[ChatMessage]) -> None:
        """Record a turn's tool calls (assistant messages in model/chat/tools.py's text format) and their results
        (role "tool"), between the user's words and the spoken answer, as the chat template wants them."""
        self._turns.extend(message for message in messages if message.role in ("assistant", "tool"))

    def add_assistant(self, text: str) -> None:
        """Record what the assistant said; an empty answer (interrupted before any audio) leaves no message."""
        text = text.strip()
        if text:
            self._turns.append(ChatMessage("assistant", text))

    def replace_last_assistant(self, text: str) -> bool:
        """Correct the newest message, when it is the assistant's, to `text` (none left when empty): the listener
        heard less (or more) of it than was estimated when its turn ended. False when the newest is not."""
        if not self._turns or self._turns[-1].role != "assistant":
            return False
        text = text.strip()
        if text:
            self._turns[-1] = ChatMessage("assistant", text)
        else:
            self._turns.pop()
        return True

    def messages(self) -> list[ChatMessage]:
        """The history window (see `window_start`); the newest message is always in it. The system prompt is the
        request's (`GenerationOptions.system_prompt`), which the model puts first."""
        start = window_start(self._turns, self.config.context_chars, self.config.keep_after_drop)
        if self.config.max_exchanges is not None:
            start = max(start, recent_start(self._turns, self.config.max_exchanges))
        return self._turns[start:]


def window_start(turns: list[ChatMessage], budget: int, keep_after_drop: float) -> int:
    """Index of the oldest message the model still sees.

    Replays the conversation: whenever the window outgrows `budget` characters, its oldest messages are dropped until
    at most `keep_after_drop * budget` remain (never the newest message), and a window never opens with the
    assistant or a tool result. Between drops the window only grows, so each prompt starts with the previous one.
    """
    low = int(budget * keep_after_drop)
    start, used = 0, 0
    for newest, message in enumerate(turns):
        used += len(message.content)
        if used <= budget:
            continue
        while start < newest and (used > low or turns[start].role in ("assistant", "tool")):
            used -= len(turns[start].content)
            start += 1
    return start


def recent_start(turns: list[ChatMessage], exchanges: int) -> int:
    """Index of the user message that opens the last `exchanges` exchanges before the newest message."""
    user_indices = [i for i, message in enumerate(turns) if message.role == "user"]
    newest_is_user = bool(turns) and turns[-1].role == "user"
    earlier = user_indices[:-1] if newest_is_user else user_indices
    if exchanges == 0:
        return user_indices[-1] if newest_is_user else len(turns)
    return earlier[-exchanges] if len(earlier) >= exchanges else 0
