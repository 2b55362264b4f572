"""The OpenAI-compatible HTTP API over one `ChatModel`: `GET /v1/models` and `POST /v1/chat/completions`.

Streams are Server-Sent Events of `chat.completion.chunk` objects ending with `data: [DONE]`. Plain streams append
committed text only (text that never changes); `diffusing: true` streams replace the whole draft in every chunk:

- each chunk with `choices[0].delta.content` carries the ENTIRE current draft, cut at the first stop string; a client
  shows it in place of the previous one (it is not appended). A chunk without `content` leaves the draft unchanged.
- each such chunk also carries the extension `diffusion: {"step": int, "committed_chars": int}`: the first
  `committed_chars` characters of this draft are final and will be identical in every later draft and in the answer.
- the last content chunk holds the final answer, equal to a non-streaming answer for the same request and seed; then
  a chunk with `finish_reason`, the usage chunk if `stream_options.include_usage`, and `data: [DONE]`.

Errors are OpenAI error objects `{"error": {"message", "type", "param", "code"}}`, FastAPI's 422 included (as 400).
Every refusal is an HTTP error before the stream starts: the handler validates, tokenizes the chat and checks it
against the context (400 `context_length_exceeded`), queues the job in the same step as the queue-full check, and a
stream answers 200 only once the job's first pass arrived. A failure after that ends the stream with one error event
and `data: [DONE]`. See model/server/API.md for the full contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model.chat import ChatMessage, ChatModel, Draft, GenerationOptions, TokenizingChatModel
from model.chat.tools import new_call_id, opens_calls, read_calls, starts_calls
from model.decoding.grammar import GrammarError
from model.errors import ContextLengthExceeded, ModelError
from model.server.answer import ToolCallDeltas, view_of
from model.server.config import ServerConfig
from model.server.inputs import ApiError, chat_messages, options_of, tools_of
from model.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from model.server.metrics import ApiMetrics
from model.server.protocol import (
    ERROR_RESPONSES,
    ChatCompletionRequest,
    chunk_object,
    completion_object,
    error_object,
    new_completion_id,
    tool_call_object,
    usage_of,
)
from model.server.scheduler import GenerationCrashed, Job, QueueFull, Scheduler, ShuttingDown

log = logging.getLogger(__name__)


class BodyLimitMiddleware:
    """Refuse request bodies over `limit` bytes with 413 before any handler parses them.

    The body is read here (at most `limit` bytes are held) and replayed; later `receive` calls pass through, so the
    app still hears `http.disconnect` and can cancel a generation whose client left.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = ApiError(413, f"Request body is larger than {self.limit} bytes", code="request_too_large")
        await error.response()(scope, receive, send)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "TextPart", "StreamOptions",
                        "NamedToolChoice"})


def _validation_message(error: dict[str, Any]) -> tuple[str, str | None]:
    """A short OpenAI-style message and the `param` path for the first pydantic error."""
    if error.get("type") == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        return f"Invalid JSON body: {detail}".rstrip(": "), None
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    # pydantic names union branches in the location ("str", "list[TextPart]"); keep only the field path
    param = ".".join(part for part in loc if part.isdigit() or (part.isidentifier() and part not in _TYPE_TAGS))
    param = param or None
    if error.get("type") == "missing" and param is None:
        return "Request body is required (JSON with 'model' and 'messages')", None
    where = f"'{param}'" if param else "the request body"
    return f"Invalid value for {where}: {error.get('msg', 'invalid')}", param


async def _collect(job: Job, stops: tuple[str, ...]) -> tuple[str, str, Draft | None]:
    """Run a job to its end: (answer text, finish reason, last draft)."""
    last: Draft | None = None
    async with contextlib.aclosing(job.stream()) as drafts:
        async for draft in drafts:
            last = draft
            view = view_of(draft, stops)
            if view.stopped:
                return view.text, "stop", last
            if draft.done:
                return view.text, _finish_reason(draft), last
    raise ShuttingDown("the generation ended without a final draft (the server is shutting down)")


def _finish_reason(draft: Draft) -> str:
    if draft.finish_reason == "cancelled":
        raise ShuttingDown("the generation was cancelled (the server is shutting down)")
    return draft.finish_reason or "stop"


async def _first_of(work: Awaitable[Any], request: Request, poll_s: float) -> Any:
    """Await `work` unless the client disconnects first; then cancel it (which cancels the job) and raise 499."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                # nobody will read this answer; 499 is the customary "client closed request" status
                raise ApiError(499, "The client disconnected; its generation was cancelled", code="client_disconnected")
    finally:
        task.cancel()


def _api_error(error: ModelError, options: GenerationOptions) -> ApiError:
    """The HTTP error for a model-side failure: a refusal is the request's fault, a crash or a shutdown the server's."""
    if isinstance(error, QueueFull):
        return ApiError(503, str(error), "server_error", code="server_overloaded")
    if isinstance(error, ShuttingDown):
        return ApiError(503, str(error), "server_error", code="shutting_down")
    if isinstance(error, GenerationCrashed):
        return ApiError(500, str(error), "server_error", code="generation_failed")
    if isinstance(error, ContextLengthExceeded):
        return ApiError(400, str(error), param="messages", code="context_length_exceeded")
    if isinstance(error, GrammarError):  # the grammar of the answer's tool calls, or of its response_format
        if options.tools is not None:
            return ApiError(400, str(error), param="tools", code="invalid_tools")
        return ApiError(400, str(error), param="response_format", code="invalid_response_format")
    return ApiError(400, str(error), code="generation_failed")


async def _prompt_of(
    model: ChatModel, messages: tuple[ChatMessage, ...], options: GenerationOptions, config: ServerConfig
) -> list[int] | None:
    """The chat's token ids, checked against the context before any work (None for a model that tokenizes on its own,
    such as a remote endpoint). Tokenizing 32,000 characters takes milliseconds, in a thread all the same."""
    if not isinstance(model, TokenizingChatModel):
        return None
    try:
        prompt = await asyncio.to_thread(model.prompt_ids, messages)
        model.check_context(len(prompt), options.max_new_tokens, config.max_context_tokens)
    except ModelError as error:
        raise _api_error(error, options) from error
    return prompt


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class _JobStream(StreamingResponse):
    """An SSE response that cancels its job however the response ends: sent in full, client gone, or never started
    (the body generator's own clean-up does not run when the client leaves before the first byte)."""

    def __init__(self, job: Job, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel.set()  # a no-op once the job has finished


async def _stream_events(
    drafts: AsyncIterator[Draft], first: Draft, options: GenerationOptions, request: ChatCompletionRequest
) -> AsyncIterator[bytes]:
    """The SSE body of a streaming request whose first draft is already known (refusals happened before the 200).

    A failure from here on ends the stream with one error event and then `data: [DONE]`.
    """
    completion_id, created, model = new_completion_id(), int(time.time()), request.model
    include_usage = request.stream_options is not None and request.stream_options.include_usage

    def chunk(delta: dict[str, str] | None, **fields: Any) -> bytes:
        return _sse(chunk_object(completion_id, model, created, delta, include_usage_field=include_usage, **fields))

    async def every_draft() -> AsyncIterator[Draft]:
        yield first
        async for draft in drafts:
            yield draft

    yield chunk({"role": "assistant", "content": ""}, **({"diffusion": {"step": -1, "committed_chars": 0}}
                                                          if request.diffusing else {}))
    sent = ""  # append mode: committed text already sent; diffusing mode: the last draft sent
    shown = 0  # append mode: characters of `sent` sent as content (none of calls, nor of text that may become them)
    sent_committed = 0  # diffusing mode: the last committed_chars sent
    last: Draft | None = None
    finish: str | None = None
    calls = ToolCallDeltas() if options.tools is not None else None  # an answer that may be tool calls
    try:
        async with contextlib.aclosing(drafts), contextlib.aclosing(every_draft()) as stream:
            async for draft in stream:
                last = draft
                view = view_of(draft, options.stop)
                if request.diffusing:
                    if (view.text, len(view.committed)) != (sent, sent_committed):
                        sent, sent_committed = view.text, len(view.committed)
                        yield chunk({"content": view.text},
                                    diffusion={"step": draft.step, "committed_chars": sent_committed})
                elif len(view.committed) > len(sent):
                    if not view.committed.startswith(sent):
                        raise GenerationCrashed("the model changed text it had committed")
                    if calls is not None and opens_calls(view.committed):  # calls, or text that may become calls
                        fragments = calls.feed(view.committed)
                        if fragments:
                            yield chunk({"tool_calls": fragments})
                    else:
                        yield chunk({"content": view.committed[shown:]})
                        shown = len(view.committed)
                    sent = view.committed
                if view.stopped or draft.done:
                    if calls is not None and not starts_calls(sent) and shown < len(sent):
                        yield chunk({"content": sent[shown:]})  # held back as a possible call, but it ended as text
                    finish = "stop" if view.stopped else _finish_reason(draft)
                    if calls is not None and finish == "stop" and any(c.closed for c in read_calls(sent)):
                        finish = "tool_calls"
                    break
        if finish is None:
            raise ShuttingDown("the generation ended without a final draft (the server is shutting down)")
    except ModelError as error:
        error_ = _api_error(error, options)
        yield _sse(error_object(error_.message, error_.type, error_.param, error_.code))
        yield _sse("[DONE]")
        return
    except Exception as error:  # a bug here must still end the stream the way the API promises
        log.exception("stream failed")
        yield _sse(error_object(f"the stream failed: {type(error).__name__}: {error}", "server_error",
                                code="generation_failed"))
        yield _sse("[DONE]")
        return
    yield chunk({}, finish_reason=finish)
    if include_usage:
        yield chunk(None, usage=usage_of(last))
    yield _sse("[DONE]")


_BEARER = HTTPBearer(auto_error=False, description="The server's DLM_API_KEY, when it sets one")


async def authorize(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
) -> None:
    """Check the bearer token against the app's key (constant-time); no key configured means no auth."""
    expected: str | None = request.app.state.config.api_key
    if expected is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, "Incorrect or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key")


def create_app(model: ChatModel, config: ServerConfig) -> FastAPI:
    """The API over `model`. The app owns one `Scheduler` (app.state.scheduler), closed when the app shuts down, and
    its metrics (app.state.metrics)."""
    metrics = ApiMetrics()
    scheduler = Scheduler(model, config.max_queue, on_draft=metrics.observe_draft)
    metrics.watch(scheduler)
    names = config.model_names or (model.name,)
    shutting_down = False

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        nonlocal shutting_down
        yield
        shutting_down = True
        await scheduler.close()

    app = FastAPI(title="dlm-serve: OpenAI-compatible diffusion LM API", version="1", lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.config = config
    app.state.metrics = metrics

    def answer(error: ApiError) -> JSONResponse:
        metrics.errors.labels(code=error.code or error.type).inc()
        return error.response()

    @app.exception_handler(ApiError)
    async def on_api_error(_: Request, error: ApiError) -> JSONResponse:
        return answer(error)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        errors = list(error.errors())
        message, param = _validation_message(errors[0]) if errors else ("Invalid request", None)
        return answer(ApiError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if error.status_code < 500 else "server_error"
        return answer(ApiError(error.status_code, str(error.detail), type_))

    # Health and metrics carry no model output and no prompt, so a balancer and Prometheus reach them without the key.
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        """Liveness: the process answers."""
        return PlainTextResponse("ok\n")

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> PlainTextResponse:
        """Readiness: the model is loaded (it is before the app exists) and a request now would be queued."""
        if shutting_down or not scheduler.accepting:
            why = "shutting down" if shutting_down else f"busy: {scheduler.pending} generations queued or running"
            return PlainTextResponse(why + "\n", status_code=503, headers={"Retry-After": "1"})
        return PlainTextResponse(f"ready: {scheduler.pending} of {scheduler.max_queue} places in use\n")

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/models", dependencies=[Depends(authorize)], responses={401: ERROR_RESPONSES[401]})
    async def list_models() -> dict[str, Any]:
        """The served model ids. `diffusing: true` and `answer_rules: true` mark that chat completions accept those
        extensions (API.md)."""
        created = int(time.time())
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": created, "owned_by": "dlm-serve", "diffusing": True,
                      "answer_rules": True}
                     for name in names],
        }

    @app.post(
        "/v1/chat/completions",
        dependencies=[Depends(authorize)],
        responses={
            **ERROR_RESPONSES,
            200: {"description": "chat.completion JSON, or with stream=true an SSE stream of chat.completion.chunk",
                  "content": {"text/event-stream": {}}},
        },
    )
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Any:
        """Answer a chat; see the module docstring and API.md for streaming and `diffusing` semantics."""
        if body.model not in names:
            raise ApiError(404, f"The model '{body.model}' does not exist; this server serves {list(names)}",
                           param="model", code="model_not_found")
        offered, tools = tools_of(body)
        messages = chat_messages(body, config, offered)
        options = options_of(body, config, tools)
        prompt = await _prompt_of(model, messages, options, config)
        try:
            job = scheduler.submit(messages, options, prompt)  # room check and queueing in one step
        except QueueFull as error:
            raise _api_error(error, options) from error
        if body.stream:
            # Wait for the first pass before answering 200, so that whatever the model refuses is an HTTP error.
            drafts = job.stream()
            try:
                first = await _first_of(anext(drafts, None), raw, config.disconnect_poll_s)
            except ModelError as error:
                raise _api_error(error, options) from error
            if first is None:
                raise _api_error(ShuttingDown("the generation was cancelled (the server is shutting down)"), options)
            return _JobStream(job, _stream_events(drafts, first, options, body))
        try:
            text, finish, last = await _first_of(_collect(job, options.stop), raw, config.disconnect_poll_s)
        except ModelError as error:
            raise _api_error(error, options) from error
        if options.tools is not None and starts_calls(text):
            calls = [call for call in read_calls(text) if call.closed]
            finish = "tool_calls" if calls and finish == "stop" else finish
            return completion_object(new_completion_id(), body.model, None, finish, last,
                                     [tool_call_object(new_call_id(), c.name, c.arguments) for c in calls])
        return completion_object(new_completion_id(), body.model, text, finish, last)

    app.add_middleware(BodyLimitMiddleware, limit=config.max_body_bytes)
    return app
