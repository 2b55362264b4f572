"""Tool calls as text: the generic format this runtime writes tools, calls and results in, and reads calls back from.

SmolLM2's chat template has no tool format, so one plain-text format serves it and any model like it
(model/server/API.md):

- the functions go in the system message: an instruction, then one compact JSON line per function
  (`{"name":...,"description":...,"parameters":{...}}`);
- a call is `<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>` (compact JSON, name first;
  parallel calls follow each other with nothing between);
- a result is a message of role "tool" holding the result as the caller sent it (ChatML, SmolLM2's template, writes
  any role: `<|im_start|>tool\n...<|im_end|>`; the bundled model answers it with text, where a user message
  `<tool_response>...</tool_response>` made it repeat the result).

The grammar (model/decoding/grammar.py `compile_tools`) makes the model write calls in exactly this shape, so reading
them back (`read_calls`) is a prefix match that works on a growing committed text as well as on a finished answer.

The chat travels in this format everywhere (the API's requests, the voice session's history). Whoever has a tool format
of its own reads it back as OpenAI's structure (`structured_chat`): a remote OpenAI-compatible server (`--llm-url`)
takes `tools` and `tool_calls`, and a chat template that renders `tools` (Qwen2.5's, Llama 3.x's) writes them its way.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.meta

from model.chat import ChatMessage
from model.decoding.grammar import compile_format, response_format
from model.decoding.options import ToolConstraint
from model.errors import ModelError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL_HEAD = re.compile(r'\{"name":"((?:[^"\\]|\\.)*)","arguments":')
_ARGUMENTS_END = "}" + CALL_CLOSE  # the call object's closing brace, then the closing tag

INSTRUCTION = (
    "You can call functions. To call one, answer with only "
    '<tool_call>{"name":<function name>,"arguments":<its arguments as JSON>}</tool_call>. '
    "A function's result comes back in a message of role tool; then answer the user with it. "
    "The functions:"
)


@dataclass(frozen=True, slots=True)
class Function:
    """A function the model may call: its parameters schema is compact JSON text."""

    name: str
    description: str
    parameters: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call read from an answer. `arguments` is the JSON text as the model wrote it; `closed`: its closing tag is
    there (a call still being written, or cut by the token budget, is not)."""

    name: str
    arguments: str
    closed: bool


def checked_function(name: str, description: str, parameters: Any) -> Function:
    """A function to offer, its parameters schema (a dict or JSON text) checked by the grammar engine now, so a
    schema it cannot enforce is refused here (`GrammarError`) rather than failing every answer that offers it."""
    fmt = response_format("json_schema", parameters, name)
    compile_format(fmt)
    return Function(name, description, fmt.schema or "")


def tools_text(functions: Sequence[Function]) -> str:
    """The system message's part that offers `functions`."""
    lines = [json.dumps({"name": f.name, "description": f.description, "parameters": json.loads(f.parameters)},
                        separators=(",", ":")) for f in functions]
    return "\n".join([INSTRUCTION, *lines])


def system_with_tools(system: str | None, functions: Sequence[Function]) -> str:
    """The system message of a chat that offers `functions`: the caller's own system text, then the offer (the one
    place that decides where the functions go, for the API and the voice session alike; `split_offer` reads it back)."""
    offer = tools_text(functions)
    return f"{system}{OFFER_SEPARATOR}{offer}" if system else offer


OFFER_SEPARATOR = "\n\n"


def split_offer(system: str) -> tuple[str | None, tuple[Function, ...]]:
    """A system message as (the caller's own text or None, the functions it offers): `system_with_tools` undone."""
    if system.startswith(INSTRUCTION):
        own, offer = None, system
    else:
        own, found, offer = system.partition(OFFER_SEPARATOR + INSTRUCTION)
        if not found:
            return system, ()
        offer = INSTRUCTION + offer
    functions = []
    for line in offer[len(INSTRUCTION):].split("\n")[1:]:
        entry = json.loads(line)
        functions.append(Function(entry["name"], entry["description"],
                                  json.dumps(entry["parameters"], separators=(",", ":"))))
    return own, tuple(functions)


def tool_object(function: Function) -> dict[str, Any]:
    """A function as OpenAI's (and transformers' chat templates') `tools` entry."""
    return {"type": "function", "function": {"name": function.name, "description": function.description,
                                             "parameters": json.loads(function.parameters)}}


def renders_tools(template: str | None) -> bool:
    """Whether a chat template writes `tools` its own way (Qwen2.5's, Llama 3.x's read the variable; SmolLM2's does
    not). A template Jinja cannot parse here renders none (transformers reports its errors when it applies it)."""
    if not template:
        return False
    try:
        parsed = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(parsed)


def template_chat(messages: Sequence[ChatMessage]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The chat as a template that renders tools takes it (transformers' convention): `structured_chat`'s messages,
    each call's arguments an object and an empty content beside calls, and the offered functions as `tools` (None
    when none are)."""
    wire, functions = structured_chat(messages)
    for message in wire:
        for call in message.get("tool_calls", ()):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        if message["content"] is None:
            message["content"] = ""
    return wire, [tool_object(function) for function in functions] or None


def structured_chat(messages: Sequence[ChatMessage]) -> tuple[list[dict[str, Any]], tuple[Function, ...]]:
    """A chat in the generic format as OpenAI's messages, and the functions its system message offers (taken out of
    it): an assistant's calls become `tool_calls` (ids `call_<message>_<call>`, the same for the same chat, so a
    server's prompt cache holds), each tool message the `tool_call_id` of the call it answers, in order. Arguments
    stay JSON text, as OpenAI sends them. Raises `ModelError` for a tool message that answers no call."""
    wire: list[dict[str, Any]] = []
    functions: tuple[Function, ...] = ()
    unanswered: list[str] = []
    first_system = next((i for i, message in enumerate(messages) if message.role == "system"), None)
    for i, message in enumerate(messages):
        if i == first_system:  # where system_with_tools put the offer
            own, functions = split_offer(message.content)
            if own is not None:
                wire.append({"role": "system", "content": own})
            continue
        calls = read_calls(message.content) if message.role == "assistant" else []
        if calls and all(call.closed for call in calls):
            ids = [f"call_{i}_{j}" for j in range(len(calls))]
            wire.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": id_, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for id_, call in zip(ids, calls, strict=True)]})
            unanswered = ids
        elif message.role == "tool":
            if not unanswered:
                raise ModelError(f"message {i} is a tool result that answers no earlier tool call")
            wire.append({"role": "tool", "tool_call_id": unanswered.pop(0), "content": message.content})
        else:
            wire.append({"role": message.role, "content": message.content})
    return wire, functions


def constraint(functions: Sequence[Function], required: bool, parallel: bool = True) -> ToolConstraint:
    """The constrained decoding of an answer that must (`required`) or may call one of `functions`."""
    return ToolConstraint(tuple((f.name, f.parameters) for f in functions), required=required, parallel=parallel)


def call_text(name: str, arguments: str) -> str:
    """An assistant's call as the model writes it. `arguments`: JSON text (re-written compact)."""
    compact = json.dumps(json.loads(arguments), separators=(",", ":"))
    return f'{CALL_OPEN}{{"name":{json.dumps(name)},"arguments":{compact}}}{CALL_CLOSE}'


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def opens_calls(text: str) -> bool:
    """Whether an answer is (or, while short, may become) tool calls rather than free text: the grammar's free text
    never starts with "<"."""
    return text.startswith("<")


def read_calls(text: str) -> list[ToolCall]:
    """The calls of an answer's committed text, the last one possibly still open: its arguments then stop before
    anything that may be the start of its closing `}</tool_call>`, so they only ever grow as the text does."""
    calls: list[ToolCall] = []
    rest = text
    while rest.startswith(CALL_OPEN):
        head = _CALL_HEAD.match(rest, len(CALL_OPEN))
        if head is None:  # the name is still being written
            break
        name = json.loads(f'"{head.group(1)}"')
        body = rest[head.end():]
        end = body.find(_ARGUMENTS_END)
        if end < 0:
            calls.append(ToolCall(name, body[: _held_back(body)], closed=False))
            break
        calls.append(ToolCall(name, body[:end], closed=True))
        rest = body[end + len(_ARGUMENTS_END):]
    return calls


def _held_back(body: str) -> int:
    """Where the end of `body` that may begin `}</tool_call>` starts (len(body) when none does)."""
    for start in range(max(0, len(body) - len(_ARGUMENTS_END)), len(body)):
        if _ARGUMENTS_END.startswith(body[start:]):
            return start
    return len(body)
