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

Models write calls their own way too (a bare JSON object, one in a code fence, Llama 3.x's `<|python_tag|>`):
model/decoding/call_formats.py spells every form, the grammar (model/decoding/grammar.py `compile_tools`) holds a
call in any of them to the offer from its trigger on, and `read_calls` reads all of them back, on a growing committed
text as well as on a finished answer. A call read back is written again in the generic format (`call_text`) wherever
the chat is kept.

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
from model.decoding.call_formats import (
    ARGUMENT_KEYS,
    GAP,
    GAP_MAX,
    OBJECT_HEAD,
    PYTHON_TAG,
    SPACE,
    TAG_CLOSE,
    TAG_OPEN,
    CallForm,
)
from model.decoding.grammar import compile_format, response_format
from model.decoding.options import ToolConstraint
from model.errors import ModelError

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
    return f'{TAG_OPEN}{{"name":{json.dumps(name)},"arguments":{compact}}}{TAG_CLOSE}'


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def opens_calls(text: str) -> bool:
    """Whether an answer is, or while short may still become, tool calls rather than free text: it opens with a
    call's trigger (`starts_calls`), or all of it could be the start of one (`{`, `<tool_`, a few spaces). Text
    that is neither is never a call (model/decoding/call_formats.py), so a stream may show it at once."""
    return starts_calls(text) or _may_trigger(text)


def starts_calls(text: str) -> bool:
    """Whether an answer opens with a call's trigger: from there on the grammar held it to calls."""
    return _TRIGGER.match(text) is not None


def read_calls(text: str) -> list[ToolCall]:
    """The calls an answer opens with, in any of the forms of model/decoding/call_formats.py, the last one possibly
    still open: its arguments are then what is written of them so far, so they only ever grow as the text does.
    Arguments are the JSON text as the model wrote it."""
    calls: list[ToolCall] = []
    at = 0
    while True:
        head = _HEAD.match(text, at)
        if head is None:  # no (further) call, or its name is still being written
            return calls
        name = json.loads(f'"{head.group("name")}"')
        end = _json_end(text, head.end())
        if end is None:
            calls.append(ToolCall(name, text[head.end():], closed=False))
            return calls
        form = next((form for form in _OPENED if head.group(form.value)), CallForm.BARE)
        closed = _TAILS[form].match(text, end)
        calls.append(ToolCall(name, text[head.end():end], closed=closed is not None))
        if closed is None:
            return calls
        at = closed.end()


_TRIGGER = re.compile(GAP + "(?:" + "|".join(form.trigger for form in CallForm) + ")")
_OPENED = tuple(form for form in CallForm if form.opener)
_HEAD = re.compile(GAP + "(?:" + "|".join(f"(?P<{form.value}>{form.opener})" for form in _OPENED) + ")?"
                   + GAP + OBJECT_HEAD + SPACE + ":" + SPACE + r'"(?P<name>(?:[^"\\]|\\.)*)"' + SPACE + "," + SPACE
                   + '"(?:' + "|".join(ARGUMENT_KEYS) + ')"' + SPACE + ":" + SPACE)
# What ends a call after its arguments: the object's brace, then the form's closing literal.
_TAILS = {form: re.compile(SPACE + r"\}" + (GAP + re.escape(form.close) if form.close else "")) for form in CallForm}
_LITERAL_OPENERS = (TAG_OPEN, PYTHON_TAG, "```")


def _may_trigger(text: str) -> bool:
    """Whether all of `text` is the start of a trigger (it has none yet): whitespace, then part of a tag, of a
    fence's opening, or of an object's head up to its "name" key."""
    rest = text.lstrip(" \t\r\n")
    if len(text) - len(rest) > GAP_MAX:
        return False
    if any(opener.startswith(rest) for opener in _LITERAL_OPENERS):
        return True
    if rest.startswith("```"):
        rest = re.sub(r"^```[a-z]*[ \t\r\n]*", "", rest)
        if not rest:
            return True
    if not rest.startswith("{"):
        return False
    rest = rest[1:].lstrip(" \t\r\n")
    return '"name"'.startswith(rest)


def _json_end(text: str, start: int) -> int | None:
    """Where the JSON value that starts at `start` ends (None: not yet written in full). The grammar made it valid
    JSON, so brackets outside strings are enough to find its end."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            if depth == 0:  # a scalar's end: the call object's closing brace
                return i
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and char in ", \t\r\n":  # a scalar's end
            return i
    return None
