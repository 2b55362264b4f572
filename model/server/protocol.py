"""The wire format of the OpenAI chat completions API as this server speaks it: request models and response builders.

The request models are the OpenAPI document's real schema (FastAPI derives `/openapi.json` from them), so schemathesis
fuzzes exactly what the handler accepts. Validation is strict (no "5" for 5, no 1 for true) because OpenAI rejects
wrong types too; unknown fields are ignored, as vLLM does, so clients that send extra OpenAI options keep working.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from model.chat import Draft

_REQUEST_CONFIG = ConfigDict(strict=True, extra="ignore")


class TextPart(BaseModel):
    model_config = _REQUEST_CONFIG
    type: Literal["text"]
    text: str


class FunctionCallBody(BaseModel):
    model_config = _REQUEST_CONFIG
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallBody(BaseModel):
    """An assistant message's earlier tool call, sent back with the conversation."""

    model_config = _REQUEST_CONFIG
    id: str
    type: Literal["function"]
    function: FunctionCallBody


class Message(BaseModel):
    """A chat message. `developer` is OpenAI's newer name for `system` and is treated as one. An assistant message
    may carry `tool_calls`; a `tool` message answers one by `tool_call_id`. A null or absent content reads as empty
    (an assistant message of tool calls has none; a chat with no words at all is refused as empty)."""

    model_config = _REQUEST_CONFIG
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallBody] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionBody(BaseModel):
    """`tools[i].function`: a function the model may call; `parameters` is a JSON Schema of its arguments."""

    model_config = _REQUEST_CONFIG
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolBody(BaseModel):
    model_config = _REQUEST_CONFIG
    type: Literal["function"]
    function: FunctionBody


class NamedFunction(BaseModel):
    model_config = _REQUEST_CONFIG
    name: str


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`: the answer must call that function."""

    model_config = _REQUEST_CONFIG
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = _REQUEST_CONFIG
    include_usage: bool = False


class AnswerRulesBody(BaseModel):
    """The `answer_rules` extension (model/server/API.md): logit rules of this request, each off when 0."""

    model_config = _REQUEST_CONFIG
    no_repeat_ngram: Annotated[int, Field(ge=0, le=64)] = 0
    end_after: Annotated[int, Field(ge=0, le=100_000)] = 0
    no_copy_ngram: Annotated[int, Field(ge=0, le=64)] = 0
    no_copy_opening: Annotated[int, Field(ge=0, le=64)] = 0


class JsonSchemaBody(BaseModel):
    """`response_format.json_schema`: the schema the answer must match (enforced whatever `strict` says)."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description="A JSON Schema; see API.md for the keywords enforced")
    strict: bool | None = None


class ResponseFormatBody(BaseModel):
    """`response_format`: free text, any JSON object, or JSON matching a schema (model/server/API.md)."""

    model_config = _REQUEST_CONFIG
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaBody | None = None


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions. `diffusing` and `answer_rules` are the extensions described in model/server/API.md."""

    model_config = _REQUEST_CONFIG
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: Annotated[int | None, Field(ge=1)] = None
    max_completion_tokens: Annotated[int | None, Field(ge=1)] = None
    temperature: Annotated[float | None, Field(ge=0.0, le=2.0)] = None
    seed: Annotated[int | None, Field(ge=-(2**63), le=2**63 - 1, description="a 64-bit signed integer")] = None
    stop: str | list[str] | None = None
    n: Annotated[int | None, Field(ge=1)] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    diffusing: bool = Field(
        default=False,
        description="Stream the whole current draft in every chunk (replace, do not append). See API.md.",
    )
    answer_rules: AnswerRulesBody | None = Field(
        default=None,
        description="Logit rules for this answer (no repeated n-grams, an end after a sentence). See API.md.",
    )
    response_format: ResponseFormatBody | None = None
    tools: list[ToolBody] | None = None
    tool_choice: str | NamedToolChoice | None = Field(
        default=None, description='"none", "auto" (the default with tools), "required", or a named function')
    parallel_tool_calls: bool = True
    user: str | None = None


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "Invalid request (bad JSON, wrong types, bad values)",
        401: "Missing or wrong bearer token",
        404: "Unknown model",
        413: "Request body too large",
        503: "Queue full or shutting down",
    }.items()
}


def tool_call_object(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One of a message's `tool_calls`."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def error_object(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage_of(draft: Draft | None) -> dict[str, int]:
    prompt = draft.prompt_tokens if draft is not None else 0
    completion = draft.completion_tokens if draft is not None else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_object(
    completion_id: str, model: str, text: str | None, finish_reason: str, last: Draft | None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A non-streaming `chat.completion` (with `tool_calls`, its message's content is null)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage_of(last),
    }


def chunk_object(
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    diffusion: dict[str, int] | None = None,
    usage: dict[str, int] | None = None,
    include_usage_field: bool = False,
) -> dict[str, Any]:
    """A `chat.completion.chunk`. `delta` None makes the usage-only chunk (no choices) that ends a stream."""
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }
    if diffusion is not None:
        chunk["diffusion"] = diffusion
    if include_usage_field:
        chunk["usage"] = usage
    return chunk
