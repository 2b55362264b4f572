"""A `ChatModel` that streams from any OpenAI-compatible endpoint: our `dlm-serve`, vLLM, SGLang, Inception's Mercury.

Two kinds of stream, two ways to fill a `Draft`:

- Append-only deltas (every OpenAI-compatible server): each delta is final text, so every piece is committed and the
  speculative TTS speaks committed text only.
- `diffusing` drafts (dlm-serve, Mercury): each chunk's `delta.content` is the whole current draft and replaces the
  previous one. Which part is final? dlm-serve says so in its `diffusion.committed_chars` extension, which it derives
  from committed tokens that never change, so that prefix is committed. A server that does not say (Mercury) gets no
  committed text until the stream ends, then all of it. We do not guess commits from agreement between successive
  drafts: a diffusion model may still rewrite text that looked stable for several passes, and a wrong commit would let
  the TTS speak words the answer does not contain.

`diffusing=None` asks the server: `/v1/models` entries with `"diffusing": true` (dlm-serve marks its models so) turn it
on; anything else leaves plain deltas, which every server supports. A caller's `AnswerRules` go out as the
`answer_rules` extension only to a model whose entry says `"answer_rules": true` (dlm-serve): OpenAI itself refuses
unknown fields, so other servers get the plain request and their own sampling.

Tools pass through: the chat, written in this runtime's generic tool format (model/chat/tools.py), goes out as OpenAI's
`tools`, `tool_calls` and `tool` messages (`structured_chat`), with `tool_choice` and `parallel_tool_calls` from the
caller's `ToolConstraint`, and the streamed `delta.tool_calls` fragments come back assembled into the generic call text
(`<tool_call>{"name":...,"arguments":...}</tool_call>`), the same answer a local model gives. A call is committed
whole, once the stream ends: its fragments are uncommitted draft text until then. What the calls may be is the remote
server's to enforce, with its own grammar engine (dlm-serve's is the same llguidance grammar; vLLM or llama.cpp hold
calls to the schemas their way, or not at all): this client checks only that each call's arguments are JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import httpx2
import openai

from model.chat import ChatMessage, Draft, DraftPiece, GenerationOptions
from model.chat.tools import Function, call_text, structured_chat, tool_object
from model.decoding.options import ResponseFormat, ToolConstraint
from model.errors import LmUnavailable, ModelError

_CANCEL_POLL_S = 0.05
# A service that is down must fail a turn in seconds, not minutes: connecting is quick on any network that works, and a
# healthy server sends a chunk per pass (tens of ms), so 15 s without one is a server that is stuck or overloaded.
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 15.0
_RETRY = "; this turn is not answered, the next one tries again"
# What a stream raises when its connection breaks: openai 3 reads through httpx2, earlier releases through httpx; a
# response closed under a broken read raises StreamError (a RuntimeError, not an HTTPError).
_HTTP_ERRORS = (httpx.HTTPError, httpx.StreamError, httpx2.HTTPError, httpx2.StreamError)


class OpenAIChatModel:
    """Stream chat answers from `base_url` (e.g. http://127.0.0.1:8000/v1) as `Draft`s."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        diffusing: bool | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.name = model
        self.base_url = base_url
        # openai insists on a key; servers without auth ignore the header
        timeout = httpx2.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "no-key", timeout=timeout, max_retries=1)
        self._diffusing = diffusing
        self._extensions: dict[str, Any] | None = None  # the model's /v1/models entry beyond OpenAI's fields

    @classmethod
    def from_flags(cls, url: str, model: str, key_env: str | None = None) -> OpenAIChatModel:
        """From the pipeline's `--llm-url URL --llm-model NAME [--llm-key-env VAR]`: the key is read from VAR."""
        api_key = None
        if key_env:
            api_key = os.environ.get(key_env)
            if not api_key:
                raise ModelError(f"--llm-key-env names {key_env}, but that environment variable is not set")
        return cls(url, model, api_key=api_key)

    @property
    def diffusing(self) -> bool:
        """Whether answers are requested as whole diffusing drafts (probed from /v1/models on first use if unset)."""
        if self._diffusing is None:
            self._diffusing = bool(self.extensions.get("diffusing", False))
        return self._diffusing

    @property
    def extensions(self) -> dict[str, Any]:
        """What the server's `/v1/models` entry for this model says beyond OpenAI's fields (probed once)."""
        if self._extensions is None:
            self._extensions = self._probe_extensions()
        return self._extensions

    def _probe_extensions(self) -> dict[str, Any]:
        try:
            models = self._client.models.list()
        except openai.APIError as error:
            raise _failure(f"cannot list models at {self.base_url}", error) from error
        for entry in models.data:
            if entry.id == self.name:
                return dict(entry.model_extra or {})
        return {}

    @property
    def constrains_answers(self) -> bool:
        """Tools and response formats are passed on (`ConstrainsAnswers`): the remote server holds answers to them
        with its own grammar engine, which this client cannot check beyond reading the calls back."""
        return True

    def stream_chat(
        self,
        messages: Sequence[ChatMessage],
        options: GenerationOptions,
        cancel: threading.Event | None = None,
    ) -> Iterator[Draft]:
        """Yield a Draft per chunk that changes the text; the last has `done=True`. `cancel` closes the stream."""
        wire, functions = structured_chat(_with_system(messages, options.system_prompt))
        if options.tools is not None and not functions:  # a constraint without an offer: its functions, undescribed
            functions = tuple(Function(name, "", parameters) for name, parameters in options.tools.tools)
        # dlm-serve's whole-draft streams carry no tool calls: an answer that may be calls asks for plain deltas
        diffusing = self.diffusing and options.tools is None
        request: dict[str, Any] = {
            "model": self.name,
            "messages": wire,
            "max_tokens": options.max_new_tokens,
            "temperature": options.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if options.seed is not None:
            request["seed"] = options.seed
        if options.stop:
            request["stop"] = list(options.stop)
        if options.response_format is not None:
            request["response_format"] = _wire_format(options.response_format)
        if functions:
            request.update(_wire_tools(functions, options.tools))
        extra: dict[str, Any] = {"diffusing": True} if diffusing else {}
        if options.rules.active and self.extensions.get("answer_rules"):
            extra["answer_rules"] = dataclasses.asdict(options.rules)
        if extra:
            request["extra_body"] = extra
        cancel = cancel or threading.Event()
        try:
            stream = self._client.chat.completions.create(**request)
        except openai.APIError as error:
            raise _failure(f"chat request to {self.base_url} failed", error) from error
        finished = threading.Event()
        watcher = threading.Thread(
            target=_close_when_cancelled, args=(cancel, finished, stream), name="openai-stream-cancel", daemon=True
        )
        watcher.start()
        try:
            yield from self._drafts(stream, diffusing, cancel)
        finally:
            finished.set()
            stream.close()

    def _drafts(self, stream: Any, diffusing: bool, cancel: threading.Event) -> Iterator[Draft]:
        text, committed_chars, step = "", 0, 0
        calls = _CallFragments()
        finish_reason: str | None = None
        prompt_tokens = completion_tokens = 0
        last_time = time.monotonic()
        try:
            for chunk in stream:
                if cancel.is_set():
                    break
                if chunk.usage is not None:
                    prompt_tokens, completion_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                changed = False
                for choice in chunk.choices:
                    finish_reason = choice.finish_reason or finish_reason
                    changed = calls.feed(choice.delta.tool_calls or ()) or changed
                    content = choice.delta.content
                    if content is None:
                        continue
                    if diffusing:
                        changed = changed or content != text
                        text = content
                        extension = (chunk.model_extra or {}).get("diffusion") or {}
                        committed_chars = min(int(extension.get("committed_chars", 0)), len(text))
                    elif content:
                        changed = True
                        text += content
                        committed_chars = len(text)
                if changed:
                    now = time.monotonic()
                    yield Draft(step=step, pieces=_pieces(text, committed_chars, calls.partial()),
                                elapsed_s=now - last_time)
                    step, last_time = step + 1, now
        except (openai.APIError, *_HTTP_ERRORS) as error:
            if not cancel.is_set():
                raise _failure(f"stream from {self.base_url} failed", error) from error
        if finish_reason is None and not cancel.is_set():
            # the service went away mid-answer (a stream that just stops, no finish_reason): never pass that off as
            # the whole answer
            raise LmUnavailable(f"the language model at {self.base_url} stopped mid-answer{_RETRY}")
        if cancel.is_set():
            yield Draft(step=step, pieces=_pieces(text, committed_chars, calls.partial()), done=True,
                        finish_reason="cancelled", elapsed_s=time.monotonic() - last_time)
            return
        if calls:
            if text.strip():
                raise ModelError(f"the model at {self.base_url} answered with words and tool calls together; "
                                 "an answer here is one or the other")
            text = calls.text(self.base_url, cut=finish_reason == "length")
        yield Draft(
            step=step,
            pieces=_pieces(text, len(text)),
            done=True,
            finish_reason="stop" if finish_reason == "tool_calls" else finish_reason or "stop",
            elapsed_s=time.monotonic() - last_time,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )


class _CallFragments:
    """The streamed `delta.tool_calls` of one answer, assembled by their `index` (name first, arguments in pieces)."""

    def __init__(self) -> None:
        self._calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]

    def __bool__(self) -> bool:
        return bool(self._calls)

    def feed(self, fragments: Sequence[Any]) -> bool:
        for fragment in fragments:
            call = self._calls.setdefault(fragment.index, ["", ""])
            if fragment.function is not None:
                call[0] = call[0] or fragment.function.name or ""
                call[1] += fragment.function.arguments or ""
        return bool(fragments)

    def partial(self) -> str:
        """The calls so far as generic call text, without their ends: for a draft, never committed."""
        return "".join(_open_call(name, arguments) for name, arguments in self._ordered())

    def text(self, where: str, cut: bool) -> str:
        """The finished calls as the generic call text (arguments re-written compact). `cut`: the token budget ended
        the answer, so its last call may be unfinished: it stays open, as a local model's cut call does."""
        calls = self._ordered()
        parts = []
        for i, (name, arguments) in enumerate(calls):
            try:
                parts.append(call_text(name, arguments))
            except json.JSONDecodeError as error:
                if cut and i == len(calls) - 1:
                    parts.append(_open_call(name, arguments))
                    break
                raise ModelError(f"the model at {where} wrote a tool call whose arguments are not JSON: {error}"
                                 ) from error
        return "".join(parts)

    def _ordered(self) -> list[tuple[str, str]]:
        return [(name, arguments) for _, (name, arguments) in sorted(self._calls.items())]


def _open_call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name":{json.dumps(name)},"arguments":{arguments}'


def _pieces(text: str, committed_chars: int, calls: str = "") -> tuple[DraftPiece, ...]:
    """Committed text, then what is not final yet: the rest of the text, or (in place of words) calls being written."""
    pieces = []
    if committed_chars and not calls:
        pieces.append(DraftPiece(text[:committed_chars], committed=True))
    pending = calls or text[committed_chars:]
    if pending:
        pieces.append(DraftPiece(pending, committed=False, confidence=0.0))
    return tuple(pieces)


def _wire_format(fmt: ResponseFormat) -> dict[str, Any]:
    """A response format as OpenAI's `response_format` (strict: the remote must enforce it, as this runtime does)."""
    if fmt.schema is None:
        return {"type": "json_object"}
    schema = {"name": fmt.name or "response", "schema": json.loads(fmt.schema), "strict": True}
    return {"type": "json_schema", "json_schema": schema}


def _wire_tools(functions: Sequence[Function], constraint: ToolConstraint | None) -> dict[str, Any]:
    """OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` for a chat offering `functions` under `constraint`
    (None: offered, but no call allowed, as on a tool loop's last round). Not `strict`: OpenAI's strict mode refuses
    schemas with optional properties, which tools (an MCP server's) have; servers that constrain calls do anyway."""
    tools = [tool_object(function) for function in functions]
    if constraint is None:
        return {"tools": tools, "tool_choice": "none"}
    choice: Any = "required" if constraint.required else "auto"
    if constraint.required and len(constraint.tools) == 1:
        choice = {"type": "function", "function": {"name": constraint.tools[0][0]}}
    return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": constraint.parallel}


def _with_system(messages: Sequence[ChatMessage], system_prompt: str | None) -> list[ChatMessage]:
    """The chat as the API takes it; a chat without a system message gets the caller's `system_prompt`."""
    if system_prompt and not any(message.role == "system" for message in messages):
        return [ChatMessage("system", system_prompt), *messages]
    return list(messages)


def _close_when_cancelled(cancel: threading.Event, finished: threading.Event, stream: Any) -> None:
    """Close the HTTP stream as soon as `cancel` is set, so a reader blocked on the socket wakes up at once."""
    while not finished.is_set():
        if cancel.wait(_CANCEL_POLL_S):
            stream.close()
            return


def _failure(what: str, error: Exception) -> ModelError:
    """The service unreachable, timing out or failing (5xx) is `LmUnavailable`; a refusal of this request is not."""
    status = getattr(error, "status_code", None)
    transport = isinstance(error, openai.APIConnectionError | httpx.TransportError | httpx2.TransportError
                           | httpx2.StreamError)
    if transport or (status is not None and status >= 500):
        return LmUnavailable(f"{what}: {_describe(error)}{_RETRY}")
    return ModelError(f"{what}: {_describe(error)}")


def _describe(error: Exception) -> str:
    status = getattr(error, "status_code", None)
    message = getattr(error, "message", None) or str(error)
    return f"HTTP {status}: {message}" if status else message
