"""A Realtime client's own function tools, parsed and checked without I/O: `session.tools`, `session.tool_choice`
and the `function_call_output` items that return their results.

The functions go to the voice session as `ClientTools` (voice/tools/loop.py): offered to the model beside the
server's own tools, through the same system-prompt offer and grammar; a call of one ends the response with the
`function_call` item, unrun, and the client's `function_call_output` comes back by its `call_id`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from model.chat.tools import Function, checked_function
from model.errors import ModelError
from voice.tools.loop import ClientTools, ToolChoice
from web.realtime.errors import RealtimeError, Unsupported, fields, short

MAX_TOOLS = 32
MAX_OUTPUT_CHARS = 8000  # a result the model reads: more would crowd out the conversation
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_tools(value: Any) -> tuple[Function, ...]:
    """`session.tools`: function tools only (name, description, parameters), each schema checked by the grammar
    engine now so that a schema it cannot enforce is refused here, not at every answer."""
    param = "session.tools"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RealtimeError("session.tools must be a list", param=param)
    if len(value) > MAX_TOOLS:
        raise RealtimeError(f"session.tools holds at most {MAX_TOOLS} tools", param=param)
    functions: list[Function] = []
    for index, tool in enumerate(value):
        where = f"{param}[{index}]"
        if not isinstance(tool, dict):
            raise RealtimeError(f"{where} must be an object", param=where)
        if tool.get("type", "function") != "function":
            raise Unsupported(f"{where}: tools of type {short(repr(tool.get('type')), 40)} are not supported; "
                              "function tools are", param=f"{where}.type")
        fields(tool, where, {"type", "name", "description", "parameters"})
        name = tool.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise RealtimeError(f"{where}.name must be 1 to 64 letters, digits, _ or -", param=f"{where}.name")
        if any(function.name == name for function in functions):
            raise RealtimeError(f"tool {name} is given twice", param=f"{where}.name")
        description = tool.get("description", "")
        if not isinstance(description, str):
            raise RealtimeError(f"{where}.description must be a string", param=f"{where}.description")
        parameters = tool.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise RealtimeError(f"{where}.parameters must be a JSON schema object", param=f"{where}.parameters")
        try:
            functions.append(checked_function(name, description, parameters))
        except ModelError as err:  # the grammar engine cannot enforce this schema
            raise Unsupported(f"tool {name}: {err}", param=f"{where}.parameters") from None
    return tuple(functions)


def parse_tool_choice(value: Any, functions: tuple[Function, ...]) -> ToolChoice:
    """`session.tool_choice`: auto, none, required, or `{"type": "function", "name": ...}` naming one of the
    session's tools."""
    param = "session.tool_choice"
    if value in ("auto", "none", "required"):
        return ToolChoice(value)
    if not isinstance(value, dict) or value.get("type") != "function":
        raise Unsupported("session.tool_choice: auto, none, required or a function", param=param)
    fields(value, param, {"type", "name"})
    name = value.get("name")
    if not any(function.name == name for function in functions):
        raise RealtimeError(f"tool_choice names {short(repr(name), 40)}, which is not one of the session's tools",
                            param=f"{param}.name")
    return ToolChoice("required", function=name)


def tools_json(tools: ClientTools) -> tuple[list[dict[str, Any]], Any]:
    """`session.tools` and `session.tool_choice` as the session reports them."""
    listed = [{"type": "function", "name": f.name, "description": f.description,
               "parameters": json.loads(f.parameters)} for f in tools.functions]
    choice = tools.choice
    return listed, {"type": "function", "name": choice.function} if choice.function is not None else choice.mode


def parse_output_item(item: dict[str, Any]) -> tuple[str | None, str, str]:
    """A `function_call_output` item: (its id, the call id it answers, the output text)."""
    fields(item, "item", {"type", "id", "object", "status", "call_id", "output"})
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise RealtimeError("a function_call_output needs the call_id of the call it answers", param="item.call_id")
    output = item.get("output")
    if not isinstance(output, str):
        raise RealtimeError("item.output must be a string (JSON text, as the API sends it)", param="item.output")
    if len(output) > MAX_OUTPUT_CHARS:
        raise RealtimeError(f"item.output is longer than {MAX_OUTPUT_CHARS} characters", param="item.output")
    item_id = item.get("id")
    return (item_id if isinstance(item_id, str) and item_id else None), call_id, output
