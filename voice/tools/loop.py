"""One turn's tool loop, no I/O: the model answers with calls, the session runs them, the results go back, and the
model answers again, in words.

    ToolLoop(messages, functions, options, external, choice) -> options() -> the model's answer -> answered(text)
        Speak()          the answer is words: speak it (the only kind of answer ever spoken)
        RunTools(calls)  run them, then results(calls, outcomes) -> None (ask the model again) or an apology
        HandOut(calls)   calls of `external` functions, whose results come from outside (a Realtime client runs its
                         own tools): handed_out(decision), and the turn ends with them, unanswered; the results come
                         back as tool messages in the history, and a later turn answers them
        Apologise(text)  say this instead (a call cut short, or more rounds than `max_rounds`)

Calls and results are kept as the chat template wants them (model/chat/tools.py): the assistant's calls in the
generic `<tool_call>` text (whichever form the model wrote them in: model/decoding/call_formats.py), each result as
a message of role "tool". `added` is what the turn adds to the history
before the spoken answer. The offer of the functions goes in the system prompt (`system_with_tools`, as the API
does), the same on every round and every turn, so the LM's cache of the prompt's head is reused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from model.chat import ChatMessage, GenerationOptions
from model.chat.tools import (
    Function,
    ToolCall,
    call_text,
    constraint,
    new_call_id,
    read_calls,
    starts_calls,
    system_with_tools,
)
from voice.errors import ToolError

COULD_NOT_FINISH = "Sorry, I could not finish that."


@dataclass(frozen=True, slots=True)
class Speak:
    """The answer is words."""


@dataclass(frozen=True, slots=True)
class RunTools:
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class HandOut:
    """Calls of functions run outside the session: each gets its `call_ids` entry, by which its result comes back."""

    calls: tuple[ToolCall, ...]
    call_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Apologise:
    text: str


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """Which answers a turn's first round may be (the API's `tool_choice`): "auto" words or calls, "none" words
    only, "required" a call; `function` set: a call of that function. Rounds after a tool's result are "auto" (the
    model must be able to say the result)."""

    mode: Literal["auto", "none", "required"] = "auto"
    function: str | None = None


@dataclass(frozen=True, slots=True)
class ClientTools:
    """Functions a client runs itself (a Realtime session's `tools`: their results come from outside), and the
    choice over all the tools an answer is offered."""

    functions: tuple[Function, ...] = ()
    choice: ToolChoice = ToolChoice()


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
        external: Collection[str] = (),
        choice: ToolChoice = ToolChoice(),
    ) -> None:
        self.messages = list(messages)
        self.functions = tuple(functions)
        self.external = frozenset(external)  # names among `functions` whose results come from outside
        self.choice = choice
        self.added: list[ChatMessage] = []
        self.rounds = 0
        self.max_rounds = max_rounds
        self._options = offered_options(options, self.functions)

    def options(self) -> GenerationOptions:
        """The next answer's options: calls allowed while rounds are left ("auto": words or calls, the grammar
        decides the shape; the first round as `choice` says); words only after that. The system prompt offers every
        function whatever the choice, so the LM's cache of the prompt's head holds."""
        if not self.functions or self.rounds >= self.max_rounds or (self.rounds == 0 and self.choice.mode == "none"):
            return self._options
        offered, required = self.functions, self.rounds == 0 and self.choice.mode == "required"
        named = tuple(f for f in self.functions if f.name == self.choice.function)
        if self.rounds == 0 and named:  # (a named function no longer offered leaves the choice to the mode)
            offered, required = named, True
        return dataclasses.replace(self._options, tools=constraint(offered, required=required, parallel=False))

    def answered(self, text: str) -> Speak | RunTools | HandOut | Apologise:
        """What to do with a finished answer's text."""
        if not starts_calls(text):
            return Speak()
        calls = tuple(read_calls(text))
        if not calls or not all(call.closed for call in calls) or self.rounds >= self.max_rounds:
            return Apologise(COULD_NOT_FINISH)  # cut by the token budget, or calls where words were due
        outside = [call.name in self.external for call in calls]
        if all(outside):
            return HandOut(calls, tuple(new_call_id() for _ in calls))
        if any(outside):  # one round cannot both wait for a client and go on (the grammar allows one call a round)
            return Apologise(COULD_NOT_FINISH)
        return RunTools(calls)

    def handed_out(self, decision: HandOut) -> None:
        """The calls went out: the history keeps them (their results are added when they come back)."""
        self.rounds += 1
        message = _calls_message(decision.calls)
        self.messages.append(message)
        self.added.append(message)

    def results(self, calls: Sequence[ToolCall], outcomes: Sequence[str | ToolError]) -> Apologise | None:
        """Add the round's calls and their results to the chat; an apology when a call failed (said instead of
        asking the model again: a 135M model reading an error tends to claim success), else None."""
        self.rounds += 1
        messages = [_calls_message(calls)]
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


def _calls_message(calls: Sequence[ToolCall]) -> ChatMessage:
    """A round's calls as the assistant message the chat template wants."""
    return ChatMessage("assistant", "".join(call_text(call.name, call.arguments) for call in calls))
