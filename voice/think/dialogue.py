"""Chat history for one conversation: a system prompt suited to speech and a context budget.

No I/O. The session appends what the user said and what the assistant *actually said* (after barge-in, only the phrases
whose audio was played), and asks for the messages to send to the model. When the history outgrows the budget the
oldest exchanges are dropped first, always keeping the system prompt and the newest user message.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.chat import ChatMessage


@dataclass(frozen=True, slots=True)
class DialogueConfig:
    system_prompt: str | None = None  # None: the model's own (the bundled model's is tuned for short spoken answers)
    context_chars: int = 2400  # about 600 tokens: the bundled model's answers degrade on long contexts
    max_user_chars: int = 2000  # longer user input is cut (typed text can be arbitrarily long)


class Dialogue:
    """The running conversation. `messages()` is what the model sees for the next answer."""

    def __init__(self, config: DialogueConfig | None = None) -> None:
        self.config = config or DialogueConfig()
        self._turns: list[ChatMessage] = []

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

    def add_assistant(self, text: str) -> None:
        """Record what the assistant said; an empty answer (interrupted before any audio) leaves no message."""
        text = text.strip()
        if text:
            self._turns.append(ChatMessage("assistant", text))

    def drop_last_user(self) -> str:
        """Remove the newest user message (its turn was abandoned) and return its text."""
        if self._turns and self._turns[-1].role == "user":
            return self._turns.pop().content
        return ""

    def messages(self) -> list[ChatMessage]:
        """System prompt + as many of the newest messages as fit the budget (always the newest one)."""
        kept: list[ChatMessage] = []
        used = 0
        for message in reversed(self._turns):
            used += len(message.content)
            if kept and used > self.config.context_chars:
                break
            kept.append(message)
        kept.reverse()
        while kept and kept[0].role == "assistant":  # a history must not open with the assistant
            kept.pop(0)
        system = [ChatMessage("system", self.config.system_prompt)] if self.config.system_prompt else []
        return system + kept
