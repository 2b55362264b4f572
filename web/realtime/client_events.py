"""What a Realtime client sends, parsed and checked without I/O: one typed event per frame, or a `RealtimeError`.

Names and shapes follow the official `openai` client's `types/realtime` (the GA interface: `session.update` with a
nested `audio.input` / `audio.output`). A field this server does not implement is refused by name rather than
ignored, so a client never believes a setting took effect when it did not; a refused `session.update` changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from voice.errors import AudioFormatError
from voice.tools.loop import ClientTools, ToolChoice
from voice.turn.tuning import TurnTuning
from web.realtime.audio import FORMATS, PCM16_24K, AudioFormat, decode_base64
from web.realtime.errors import RealtimeError, Unsupported, fields, short
from web.realtime.tools import parse_output_item, parse_tool_choice, parse_tools, tools_json
from web.realtime.turn_detection import SERVER_TUNING, TurnDetection, parse_turn_detection


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """A connection's Realtime session: what `session.created` / `session.updated` report and the translator obeys.
    `instructions` None: the session's own system prompt. `turn_detection` None: manual commits."""

    model: str = "voice-assistant"
    instructions: str | None = None
    input_format: AudioFormat = PCM16_24K
    output_format: AudioFormat = PCM16_24K
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription: bool = True
    voice: str = "joe"
    tools: ClientTools = field(default_factory=ClientTools)  # the client's own functions, and the choice over all tools

    def as_json(self, session_id: str, default_instructions: str,
                server_tuning: TurnTuning = SERVER_TUNING) -> dict[str, Any]:
        tools, tool_choice = tools_json(self.tools)
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": ["audio"],
            "instructions": self.instructions if self.instructions is not None else default_instructions,
            "tools": tools,
            "tool_choice": tool_choice,
            "max_output_tokens": "inf",
            "audio": {
                "input": {
                    "format": self.input_format.as_json(),
                    "transcription": {"model": "whisper-tiny.en"} if self.transcription else None,
                    "noise_reduction": None,
                    "turn_detection": None if self.turn_detection is None else
                    self.turn_detection.as_json(server_tuning),
                },
                "output": {"format": self.output_format.as_json(), "voice": self.voice, "speed": 1.0},
            },
        }

    @property
    def turn_tuning(self) -> TurnTuning:
        """What the session's listener is tuned by (manual commits: the server's own settings)."""
        return self.turn_detection.tuning() if self.turn_detection is not None else TurnTuning()

    @property
    def creates_responses(self) -> bool:
        """Whether the end of a spoken turn answers by itself (server VAD with `create_response`)."""
        return self.turn_detection is not None and self.turn_detection.create_response


# --- the client's events -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SessionUpdate:
    event_id: str | None
    settings: SessionSettings  # the whole session as it will be, the update applied


@dataclass(frozen=True, slots=True)
class AppendAudio:
    event_id: str | None
    audio: bytes  # in the session's input format, as sent


@dataclass(frozen=True, slots=True)
class CommitAudio:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class ClearAudio:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class CreateUserText:
    event_id: str | None
    item_id: str | None
    text: str


@dataclass(frozen=True, slots=True)
class CreateUserAudio:
    event_id: str | None
    item_id: str | None
    audio: bytes  # in the session's input format, as sent


@dataclass(frozen=True, slots=True)
class CreateToolOutput:
    """The result of a function call the server handed out (`function_call_output`)."""

    event_id: str | None
    item_id: str | None
    call_id: str
    output: str


@dataclass(frozen=True, slots=True)
class CreateResponse:
    event_id: str | None
    instructions: str | None = None  # this response's system prompt (the session's when None)


@dataclass(frozen=True, slots=True)
class CancelResponse:
    event_id: str | None
    response_id: str | None


@dataclass(frozen=True, slots=True)
class TruncateItem:
    event_id: str | None
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class DeleteItem:
    event_id: str | None
    item_id: str


ClientEvent = (SessionUpdate | AppendAudio | CommitAudio | ClearAudio | CreateUserText | CreateUserAudio
               | CreateToolOutput | CreateResponse | CancelResponse | TruncateItem | DeleteItem)

# Events of the API this server knows and refuses, with why.
REFUSED_EVENTS = {
    "conversation.item.retrieve": "conversation.item.retrieve is not supported: the server keeps no item audio",
    "output_audio_buffer.clear": "output_audio_buffer.clear is for WebRTC and SIP; over a WebSocket use "
                                 "response.cancel and conversation.item.truncate",
}


def parse_client_event(text: str | bytes, current: SessionSettings, max_text_chars: int) -> ClientEvent:
    """One frame -> one event. Raises RealtimeError with a message fit for the client, whatever the input."""
    if not isinstance(text, str):
        raise RealtimeError("binary frames are not part of the Realtime protocol: send JSON events as text "
                            "(audio goes base64 in input_audio_buffer.append)")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RealtimeError(f"invalid JSON: {short(str(exc))}") from None
    if not isinstance(obj, dict):
        raise RealtimeError("a client event must be a JSON object")
    event_id = obj.get("event_id")
    event_id = event_id if isinstance(event_id, str) else None
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise RealtimeError('a client event needs a string field "type"', param="type", event_id=event_id)
    try:
        return _parse(kind, obj, event_id, current, max_text_chars)
    except RealtimeError as err:
        err.event_id = event_id
        raise
    except AudioFormatError as err:
        raise RealtimeError(str(err), "invalid_audio", "audio", event_id) from None


def _parse(kind: str, obj: dict[str, Any], event_id: str | None, current: SessionSettings,
           max_text_chars: int) -> ClientEvent:
    match kind:
        case "session.update":
            fields(obj, kind, {"session"})
            return SessionUpdate(event_id, _session(_object(obj, "session", kind), current))
        case "input_audio_buffer.append":
            fields(obj, kind, {"audio"})
            audio = decode_base64(_string(obj, "audio", kind), "audio")
            if not audio:
                raise RealtimeError("input_audio_buffer.append carries no audio", param="audio")
            if len(audio) % current.input_format.bytes_per_sample:
                raise RealtimeError(f"{len(audio)} bytes are not whole samples of {current.input_format.type}",
                                    "invalid_audio", "audio")
            return AppendAudio(event_id, audio)
        case "input_audio_buffer.commit":
            fields(obj, kind, set())
            return CommitAudio(event_id)
        case "input_audio_buffer.clear":
            fields(obj, kind, set())
            return ClearAudio(event_id)
        case "conversation.item.create":
            fields(obj, kind, {"item", "previous_item_id"})
            return _item_create(obj, event_id, current, max_text_chars)
        case "response.create":
            fields(obj, kind, {"response"})
            params = obj.get("response")
            if params is not None and not isinstance(params, dict):
                raise RealtimeError("response must be an object", param="response")
            if params:
                _refuse_response_params(params)
            instructions = (params or {}).get("instructions")
            if instructions is not None and not isinstance(instructions, str):
                raise RealtimeError("response.instructions must be a string", param="response.instructions")
            return CreateResponse(event_id, instructions or None)
        case "response.cancel":
            fields(obj, kind, {"response_id"})
            response_id = obj.get("response_id")
            if response_id is not None and not isinstance(response_id, str):
                raise RealtimeError("response_id must be a string", param="response_id")
            return CancelResponse(event_id, response_id)
        case "conversation.item.truncate":
            fields(obj, kind, {"item_id", "content_index", "audio_end_ms"})
            return TruncateItem(event_id, _string(obj, "item_id", kind), _count(obj, "content_index", kind),
                                _count(obj, "audio_end_ms", kind))
        case "conversation.item.delete":
            fields(obj, kind, {"item_id"})
            return DeleteItem(event_id, _string(obj, "item_id", kind))
    if kind in REFUSED_EVENTS:
        raise Unsupported(REFUSED_EVENTS[kind], param="type")
    raise RealtimeError(f"unknown event type {short(repr(kind))}", "unknown_event", param="type")


def _item_create(obj: dict[str, Any], event_id: str | None, current: SessionSettings,
                 max_text_chars: int) -> CreateUserText | CreateUserAudio | CreateToolOutput:
    item = _object(obj, "item", "conversation.item.create")
    item_type = item.get("type", "message")
    if item_type == "function_call_output":
        return CreateToolOutput(event_id, *parse_output_item(item))
    if item_type == "function_call":
        raise Unsupported("conversation.item.create of a function_call item: calls are the model's (give the "
                          "tools in session.tools)", param="item.type")
    if item_type != "message":
        raise RealtimeError(f"unknown item type {short(repr(item_type))}", param="item.type")
    fields(item, "item", {"type", "role", "content", "id", "object", "status"})
    if item.get("role") != "user":
        raise Unsupported(f"conversation.item.create of a {short(repr(item.get('role')))} message: only user "
                          "messages are taken (the assistant's come from its answers; instructions set the system "
                          "prompt)", param="item.role")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise RealtimeError("item.content must be a non-empty list", param="item.content")
    item_id = item.get("id")
    item_id = item_id if isinstance(item_id, str) and item_id else None
    if any(isinstance(part, dict) and part.get("type") == "input_audio" for part in content):
        return CreateUserAudio(event_id, item_id, _item_audio(content, current))
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "input_text" or not isinstance(part.get("text"), str):
            raise Unsupported("only input_text and input_audio content is taken in conversation.item.create",
                              param="item.content")
        fields(part, "item.content", {"type", "text"})
        texts.append(part["text"])
    text = " ".join(t.strip() for t in texts).strip()
    if not text:
        raise RealtimeError("the user message is empty", param="item.content")
    if len(text) > max_text_chars:
        raise RealtimeError(f"the user message is longer than {max_text_chars} characters", param="item.content")
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text) or any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise RealtimeError("the user message contains control characters or unpaired surrogates",
                            param="item.content")
    return CreateUserText(event_id, item_id, text)


def _item_audio(content: list[Any], current: SessionSettings) -> bytes:
    """The audio of a user item: one input_audio part, base64 in the session's input format."""
    if len(content) != 1:
        raise Unsupported("a user item with audio takes one input_audio part, alone", param="item.content")
    part = content[0]
    fields(part, "item.content", {"type", "audio", "transcript"})
    if not isinstance(part.get("audio"), str):
        raise RealtimeError("input_audio needs base64 audio", param="item.content.audio")
    audio = decode_base64(part["audio"], "item.content.audio")
    fmt = current.input_format
    if not audio or len(audio) % fmt.bytes_per_sample:
        raise RealtimeError(f"{len(audio)} bytes are not whole samples of {fmt.type}", "invalid_audio",
                            "item.content.audio")
    return audio


def _refuse_response_params(params: dict[str, Any]) -> None:
    """Of the per-response overrides only `instructions`; a response always continues the default conversation."""
    modalities = params.get("output_modalities", ["audio"])
    if modalities != ["audio"]:
        raise Unsupported("response.output_modalities: this server answers in audio (with its transcript) only",
                          param="response.output_modalities")
    rest = sorted(k for k in params if k not in ("output_modalities", "instructions"))
    if rest:
        raise Unsupported(f"response.create parameters {', '.join(rest)}: of the per-response settings only "
                          "instructions are supported", param=f"response.{rest[0]}")


# --- session.update ------------------------------------------------------------------------------------------------
_SESSION_FIELDS = {"type", "model", "instructions", "audio", "output_modalities", "tools", "tool_choice",
                   "max_output_tokens", "include", "tracing", "truncation", "prompt", "reasoning",
                   "parallel_tool_calls"}
_NOT_IMPLEMENTED = {"prompt", "reasoning", "include", "tracing"}


def _session(session: dict[str, Any], current: SessionSettings) -> SessionSettings:
    unknown = sorted(k for k in session if k not in _SESSION_FIELDS)
    if unknown:
        raise RealtimeError(f"unknown session field(s): {', '.join(short(k, 40) for k in unknown[:5])}",
                            "unknown_parameter", param=f"session.{short(unknown[0], 40)}")
    if session.get("type", "realtime") != "realtime":
        raise Unsupported("only realtime sessions are served here (not transcription)", param="session.type")
    for name in sorted(_NOT_IMPLEMENTED):
        if session.get(name) is not None:
            raise Unsupported(f"session.{name} is not supported", param=f"session.{name}")
    if session.get("output_modalities", ["audio"]) != ["audio"]:
        raise Unsupported("session.output_modalities: this server answers in audio (with its transcript) only",
                          param="session.output_modalities")
    if session.get("truncation", "auto") not in ("auto", "disabled"):
        raise Unsupported("session.truncation: only auto", param="session.truncation")
    settings = current
    if "tools" in session or "tool_choice" in session:
        functions = parse_tools(session["tools"]) if "tools" in session else current.tools.functions
        choice = current.tools.choice
        if "tool_choice" in session:
            choice = parse_tool_choice(session["tool_choice"], functions)
        elif choice.function is not None and not any(f.name == choice.function for f in functions):
            choice = ToolChoice()  # the function it named is gone: auto
        settings = replace(settings, tools=ClientTools(functions, choice))
    if "model" in session:
        settings = replace(settings, model=_text(session["model"], "session.model"))
    if "instructions" in session:
        instructions = session["instructions"]
        if instructions is not None and not isinstance(instructions, str):
            raise RealtimeError("session.instructions must be a string", param="session.instructions")
        settings = replace(settings, instructions=instructions or None)
    max_tokens = session.get("max_output_tokens", "inf")
    if max_tokens != "inf":
        raise Unsupported("session.max_output_tokens: the server's own answer length applies",
                          param="session.max_output_tokens")
    audio = session.get("audio")
    if audio is not None:
        if not isinstance(audio, dict):
            raise RealtimeError("session.audio must be an object", param="session.audio")
        fields(audio, "session.audio", {"input", "output"})
        settings = _audio(audio, settings)
    return settings


def _audio(audio: dict[str, Any], settings: SessionSettings) -> SessionSettings:
    audio_in, audio_out = audio.get("input"), audio.get("output")
    if audio_in is not None:
        if not isinstance(audio_in, dict):
            raise RealtimeError("session.audio.input must be an object", param="session.audio.input")
        fields(audio_in, "session.audio.input", {"format", "transcription", "turn_detection", "noise_reduction"})
        if audio_in.get("noise_reduction") is not None:
            raise Unsupported("session.audio.input.noise_reduction is not supported",
                              param="session.audio.input.noise_reduction")
        if "format" in audio_in:
            settings = replace(settings, input_format=_format(audio_in["format"], "session.audio.input.format"))
        if "transcription" in audio_in:
            transcription = audio_in["transcription"]
            if transcription is not None and not isinstance(transcription, dict):
                raise RealtimeError("transcription must be an object or null",
                                    param="session.audio.input.transcription")
            settings = replace(settings, transcription=transcription is not None)
        if "turn_detection" in audio_in:
            settings = replace(settings, turn_detection=parse_turn_detection(audio_in["turn_detection"]))
    if audio_out is not None:
        if not isinstance(audio_out, dict):
            raise RealtimeError("session.audio.output must be an object", param="session.audio.output")
        fields(audio_out, "session.audio.output", {"format", "voice", "speed"})
        if audio_out.get("speed", 1.0) != 1.0:
            raise Unsupported("session.audio.output.speed: speech is at its natural speed only",
                              param="session.audio.output.speed")
        if "format" in audio_out:
            settings = replace(settings, output_format=_format(audio_out["format"], "session.audio.output.format"))
        if "voice" in audio_out:
            voice = audio_out["voice"]
            if voice not in (settings.voice, None):
                raise Unsupported(f"voice {short(repr(voice), 40)}: this server has one voice, "
                                  f"{settings.voice!r}", param="session.audio.output.voice")
    return settings


def _format(value: Any, param: str) -> AudioFormat:
    if not isinstance(value, dict):
        raise RealtimeError(f"{param} must be an object", param=param)
    fields(value, param, {"type", "rate"})
    fmt = FORMATS.get(value.get("type", "audio/pcm"))
    if fmt is None:
        raise Unsupported(f"audio format {short(repr(value.get('type')), 40)}: audio/pcm (24 kHz), audio/pcmu "
                          "and audio/pcma are supported", param=param)
    if value.get("rate", fmt.rate) != fmt.rate:
        raise Unsupported(f"{fmt.type} at {value.get('rate')!r} Hz: only {fmt.rate} Hz", param=f"{param}.rate")
    return fmt


# --- small checks ------------------------------------------------------------------------------------------------
def _object(obj: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = obj.get(name)
    if not isinstance(value, dict):
        raise RealtimeError(f"{where} needs an object field {name!r}", param=name)
    return value


def _string(obj: dict[str, Any], name: str, where: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise RealtimeError(f"{where} needs a string field {name!r}", param=name)
    return value


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise RealtimeError(f"{param} must be a string", param=param)
    return value


def _count(obj: dict[str, Any], name: str, where: str) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RealtimeError(f"{where} needs a non-negative integer {name!r}", param=name)
    return value
