"""One turn's tool loop, no I/O: the model answers with calls, the session runs them, the results go back, and the
model answers again, in words.

    ToolLoop(messages, functions, options) -> options() -> the model's answer -> answered(text)
        Speak()          the answer is words: speak it (the only kind of answer ever spoken)
        RunTools(calls)  run them, then results(calls, outcomes) -> None (ask the model again) or an apology
        Apologise(text)  say this instead (a call cut short, or more rounds than `max_rounds`)

Calls and results are kept as the chat template wants them (model/chat/tools.py): the assistant's calls in the
generic `<tool_call>` text, each result as a message of role "tool". `added` is what the turn adds to the history
before the spoken answer. The offer of the functions goes in the system prompt (`system_with_tools`, as the API
does), the same on every round and every turn, so the LM's cache of the prompt's head is reused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from model.chat import ChatMessage, GenerationOptions
from model.chat.tools import Function, ToolCall, call_text, constraint, opens_calls, read_calls, system_with_tools
from voice.errors import ToolError

COULD_NOT_FINISH = "Sorry, I could not finish that."


@dataclass(frozen=True, slots=True)
class Speak:
    """The answer is words."""


@dataclass(frozen=True, slots=True)
class RunTools:
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class Apologise:
    text: str


def apology(error: ToolError) -> str:
    """What the user hears when a tool fails: its reason, as speech."""
    reason = str(error).strip().rstrip(".") or "that did not work"
    return f"Sorry, {reason}."


def offered_options(options: GenerationOptions, functions: Sequence[Function]) -> GenerationOptions:
    """A turn's options with `functions` offered in the system prompt (no calls allowed yet: see `ToolLoop.options`);
    what the LM encodes ahead of the next turn uses the same prompt."""
    if not functions:
        return options
    return dataclasses.replace(options, system_prompt=system_with_tools(options.system_prompt, functions))


class ToolLoop:
    """The tool rounds of one turn."""

    def __init__(
        self,
        messages: Sequence[ChatMessage],
        functions: Sequence[Function],
        options: GenerationOptions,
        max_rounds: int = 2,
    ) -> None:
        self.messages = list(messages)
        self.functions = tuple(functions)
        self.added: list[ChatMessage] = []
        self.rounds = 0
        self.max_rounds = max_rounds
        self._options = offered_options(options, self.functions)

    def options(self) -> GenerationOptions:
        """The next answer's options: calls allowed ("auto": words or calls, the grammar decides the shape) while
        rounds are left; words only after that."""
        if not self.functions or self.rounds >= self.max_rounds:
            return self._options
        return dataclasses.replace(self._options, tools=constraint(self.functions, required=False, parallel=False))

    def answered(self, text: str) -> Speak | RunTools | Apologise:
        """What to do with a finished answer's text."""
        if not opens_calls(text.lstrip()):
            return Speak()
        calls = tuple(read_calls(text.strip()))
        if not calls or not all(call.closed for call in calls) or self.rounds >= self.max_rounds:
            return Apologise(COULD_NOT_FINISH)  # cut by the token budget, or calls where words were due
        return RunTools(calls)

    def results(self, calls: Sequence[ToolCall], outcomes: Sequence[str | ToolError]) -> Apologise | None:
        """Add the round's calls and their results to the chat; an apology when a call failed (said instead of
        asking the model again: a 135M model reading an error tends to claim success), else None."""
        self.rounds += 1
        messages = [ChatMessage("assistant", "".join(call_text(call.name, call.arguments) for call in calls))]
        failure = None
        for outcome in outcomes:
            if isinstance(outcome, ToolError):
                failure = failure or outcome
                messages.append(ChatMessage("tool", f"error: {outcome}"))
            else:
                messages.append(ChatMessage("tool", outcome))
        self.messages += messages
        self.added += messages
        return Apologise(apology(failure)) if failure is not None else None
