"""A chat completions request as the model's inputs: its messages as the model reads them (tool calls and results
in the generic text format of model/chat/tools.py), the functions it offers, and its `GenerationOptions`. Everything a
request gets wrong is an `ApiError` here, before the answer is queued: an OpenAI error naming the field (`param`).
"""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

from model.chat import AnswerRules, ChatMessage, GenerationOptions
from model.chat.tools import Function, call_text, checked_function, constraint, system_with_tools
from model.decoding.grammar import GrammarError, compile_format, compile_tools, response_format
from model.decoding.options import ResponseFormat, ToolConstraint
from model.server.config import ServerConfig
from model.server.protocol import ChatCompletionRequest, NamedToolChoice, error_object


class ApiError(Exception):
    """An error answered to the client as an OpenAI error object with an HTTP status."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status == 503 else None
        return JSONResponse(
            error_object(self.message, self.type, self.param, self.code), status_code=self.status, headers=headers
        )


def chat_messages(
    request: ChatCompletionRequest, config: ServerConfig, offered: tuple[Function, ...]
) -> tuple[ChatMessage, ...]:
    """The chat as the model reads it: tool calls, tool results and the `offered` functions written in the generic
    text format (model/chat/tools.py); the functions join the first system message, or open the chat in one."""
    if len(request.messages) > config.max_messages:
        raise ApiError(400, f"At most {config.max_messages} messages are allowed", param="messages")
    messages: list[ChatMessage] = []
    call_ids: set[str] = set()
    for i, message in enumerate(request.messages):
        text = message.text()
        if message.role == "tool":
            if message.tool_call_id is None or message.tool_call_id not in call_ids:
                raise ApiError(400, f"The tool message answers no earlier assistant tool call: "
                               f"tool_call_id {message.tool_call_id!r}", param=f"messages.{i}.tool_call_id")
            messages.append(ChatMessage("tool", text))
            continue
        if message.role == "assistant" and message.tool_calls:
            for j, call in enumerate(message.tool_calls):
                try:
                    text += call_text(call.function.name, call.function.arguments)
                except json.JSONDecodeError as error:
                    raise ApiError(400, f"The tool call's arguments are not JSON: {error}",
                                   param=f"messages.{i}.tool_calls.{j}.function.arguments") from error
                call_ids.add(call.id)
        messages.append(ChatMessage("system" if message.role == "developer" else message.role, text))
    if offered:
        system = next((i for i, message in enumerate(messages) if message.role == "system"), None)
        if system is None:
            messages.insert(0, ChatMessage("system", system_with_tools(None, offered)))
        else:
            messages[system] = ChatMessage("system", system_with_tools(messages[system].content, offered))
    if sum(len(message.content) for message in messages) > config.max_prompt_chars:
        raise ApiError(400, f"Messages exceed {config.max_prompt_chars} characters in total", param="messages")
    return tuple(messages)


def tools_of(request: ChatCompletionRequest) -> tuple[tuple[Function, ...], ToolConstraint | None]:
    """The functions the prompt offers and the constraint on the answer (none for `tool_choice: "none"` or no
    tools), every schema checked by the grammar engine now: a 400 naming the field it refuses."""
    choice = request.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise ApiError(400, f"tool_choice must be 'none', 'auto', 'required' or a named function, not {choice!r}",
                       param="tool_choice")
    tools = request.tools or []
    if not tools:
        if choice is not None and choice != "none":
            raise ApiError(400, "tool_choice needs tools", param="tool_choice")
        return (), None
    functions: list[Function] = []
    for i, tool in enumerate(tools):
        function = tool.function
        if any(function.name == known.name for known in functions):
            raise ApiError(400, f"Two tools are named {function.name!r}", param=f"tools.{i}.function.name")
        try:
            functions.append(checked_function(function.name, function.description, function.parameters))
        except GrammarError as error:
            raise ApiError(400, f"Invalid parameters of function {function.name!r}: {error}",
                           param=f"tools.{i}.function.parameters", code="invalid_function_parameters") from error
    if choice == "none":
        return (), None
    allowed = functions
    if isinstance(choice, NamedToolChoice):
        allowed = [function for function in functions if function.name == choice.function.name]
        if not allowed:
            raise ApiError(400, f"tool_choice names {choice.function.name!r}, which is not among the tools",
                           param="tool_choice.function.name")
    wanted = constraint(allowed, required=choice is not None and choice != "auto", parallel=request.parallel_tool_calls)
    try:
        compile_tools(wanted)
    except GrammarError as error:
        raise ApiError(400, f"Invalid tools: {error}", param="tools", code="invalid_function_parameters") from error
    if request.response_format is not None and request.response_format.type != "text":
        raise ApiError(400, "response_format cannot be combined with tools (unless tool_choice is 'none')",
                       param="response_format")
    if request.diffusing:
        raise ApiError(400, "diffusing streams do not carry tool calls", param="diffusing")
    return tuple(functions), wanted


def options_of(
    request: ChatCompletionRequest, config: ServerConfig, tools: ToolConstraint | None
) -> GenerationOptions:
    if request.n not in (None, 1):
        raise ApiError(400, "Only n=1 is supported", param="n")
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options is only allowed with stream=true", param="stream_options")
    max_tokens = request.max_completion_tokens or request.max_tokens or config.default_max_tokens
    if max_tokens > config.max_tokens_limit:
        param = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        raise ApiError(400, f"{param} must be at most {config.max_tokens_limit}", param=param)
    stops = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    if len(stops) > config.max_stop_sequences or any(not stop for stop in stops):
        raise ApiError(400, f"stop takes 1..{config.max_stop_sequences} non-empty strings", param="stop")
    temperature = request.temperature if request.temperature is not None else GenerationOptions().temperature
    rules = AnswerRules(**request.answer_rules.model_dump()) if request.answer_rules is not None else AnswerRules()
    return GenerationOptions(
        max_new_tokens=max_tokens, temperature=temperature, seed=request.seed, stop=stops, rules=rules,
        response_format=_format_of(request), tools=tools,
    )


def _format_of(request: ChatCompletionRequest) -> ResponseFormat | None:
    """The request's `response_format`, its schema checked by the grammar engine now (a 400 naming what it refuses)."""
    body = request.response_format
    if body is None or body.type == "text":
        return None
    if body.type == "json_schema" and body.json_schema is None:
        raise ApiError(400, "response_format of type json_schema needs a json_schema object",
                       param="response_format.json_schema")
    try:
        fmt = (response_format(body.type) if body.json_schema is None or body.type == "json_object"
               else response_format(body.type, body.json_schema.schema_, body.json_schema.name))
        compile_format(fmt)
    except GrammarError as error:
        raise ApiError(400, f"Invalid response_format: {error}", param="response_format.json_schema.schema",
                       code="invalid_response_format") from error
    return fmt
