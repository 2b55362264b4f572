"""The Realtime protocol core, without I/O: client events become calls on the voice session, session events become
Realtime server events. The shell (web/realtime/shell.py) executes the actions and sends the events, in order.

The session (voice/turn/session.py) is the same one /ws drives: it listens, decides the end of the turn, answers and
handles barge-in. This core only renames and regroups: a session turn is a user item and, when it is answered, a
response holding one assistant message with one audio content part (after a function_call item, and its output, for
each tool the session ran). A call of one of the client's own tools ends its turn unrun: the response holds that
function_call item alone; the client's function_call_output goes to the session by call id, and response.create
asks the session for a turn that answers it. What the API leaves to the client is kept here:
typed user items wait for `response.create`; with `create_response` off (or manual turn detection), the answer the
session starts at the end of a spoken turn is held, unseen, until `response.create` asks for it.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from voice import events as ev
from voice.turn.tuning import TurnTuning
from web.realtime.actions import (
    Action,
    AnswerToolResults,
    EndAudio,
    FeedAudio,
    Interrupt,
    Send,
    SendText,
    SetInstructions,
    SetTools,
    ToolOutput,
    TruncateHeard,
    TuneTurns,
)
from web.realtime.audio import OutputEncoder, samples_in, to_pcm16
from web.realtime.client_events import (
    AppendAudio,
    CancelResponse,
    ClearAudio,
    ClientEvent,
    CommitAudio,
    CreateResponse,
    CreateToolOutput,
    CreateUserAudio,
    CreateUserText,
    DeleteItem,
    RealtimeError,
    SessionSettings,
    SessionUpdate,
    TruncateItem,
    Unsupported,
)
from web.realtime.turn_detection import SERVER_TUNING

MAX_MANUAL_BUFFER_S = 60.0  # manual turn detection: the most audio held before a commit
MAX_CALLS_OUT = 32  # calls of the client's tools waiting for their output (the session keeps as many)


@dataclass(slots=True)
class _UserItem:
    id: str
    typed: bool = False
    committed: bool = False
    explicit: bool = False  # audio the client made an item of (conversation.item.create): answered on request only
    closed: bool = False  # its turn has an answer, or ended without one
    transcript: str = ""
    delta_sent: str = ""


@dataclass(slots=True)
class _Response:
    id: str
    item_id: str
    turn: int
    held: bool
    held_events: list[dict[str, Any]] = field(default_factory=list)
    encoder: OutputEncoder | None = None
    audio_samples: int = 0  # sent, at the client's output rate
    transcript: str = ""
    answer: str = ""
    tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    audio_done: bool = False
    cancel_reason: str | None = None
    error: dict[str, Any] | None = None
    truncated_at: int | None = None  # samples at the session's rate, when the client truncated it while it ran
    message_index: int | None = None  # the assistant message's output index, once it has begun
    calls: list[dict[str, Any]] = field(default_factory=list)  # its function_call items, done
    handed_out: bool = False  # it called a client's tool: it ends with the call, no message
    own_instructions: bool = False  # it ran under its response.create's instructions: the session's come back after


class RealtimeTranslator:
    """One connection's protocol state. `start()` greets; `client_event` and `session_event` return the actions."""

    def __init__(self, session_id: str, output_sample_rate: int, default_instructions: str,
                 settings: SessionSettings | None = None, server_tuning: TurnTuning = SERVER_TUNING) -> None:
        self.session_id = session_id
        self._server_tuning = server_tuning  # the session's listener as the server configured it
        self.settings = settings or SessionSettings()
        self._output_rate = output_sample_rate
        self._default_instructions = default_instructions
        self._ids = itertools.count(1)
        self._salt = uuid.uuid4().hex[:8]
        self._manual_buffer = bytearray()  # PCM16 at the input format's rate, manual turn detection only
        self._audio_ms = 0  # input audio received, for speech_started / stopped
        self._items: dict[int, _UserItem] = {}  # session turn -> its user item
        self._last_item_id: str | None = None
        self._pending_texts: list[tuple[str, str]] = []  # typed user items not yet answered (item id, text)
        self._typed_next: _UserItem | None = None  # the typed item the next new session turn is
        self._committed_next: _UserItem | None = None  # a manual commit waiting for its session turn
        self._responses: dict[int, _Response] = {}  # session turn -> its response
        self._credits = 0  # response.create calls waiting for an answer to release
        self._own_instructions = False  # the next response runs under its response.create's instructions
        self._finished: tuple[str, int, int] | None = None  # the last finished assistant item: (id, turn, ms sent)
        self._calls_out: dict[str, str] = {}  # calls of the client's tools waiting for output: call id -> item id
        self._outputs_in = False  # a function_call_output came since the last response.create

    # --- ids and the greeting ------------------------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_{self._salt}{next(self._ids):05d}"

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "event_id": self._new_id("event"), **fields}

    def start(self) -> list[Action]:
        return [Send(self._event("session.created", session=self._session_json()))]

    def _session_json(self) -> dict[str, Any]:
        return self.settings.as_json(f"sess_{self.session_id}", self._default_instructions, self._server_tuning)

    def error(self, err: RealtimeError | Exception, code: str | None = None) -> Send:
        """The Realtime `error` event for `err` (a refused client event, or the session's own failure)."""
        if isinstance(err, RealtimeError):
            kind = "invalid_request_error"
            body = {"type": kind, "code": err.code, "message": str(err), "param": err.param, "event_id": err.event_id}
        else:
            body = {"type": "server_error", "code": code or getattr(err, "code", "server_error"),
                    "message": str(err), "param": None, "event_id": None}
        return Send(self._event("error", error=body))

    # --- client events -------------------------------------------------------------------------------------------
    def client_event(self, event: ClientEvent) -> list[Action]:
        """The actions for one parsed client event. Raises RealtimeError for one that cannot be done now."""
        try:
            return self._client_event(event)
        except RealtimeError as err:
            err.event_id = err.event_id or event.event_id
            raise

    def _client_event(self, event: ClientEvent) -> list[Action]:
        match event:
            case SessionUpdate(settings=settings):
                # the tools first: the session may refuse them (a name of its own), and then nothing changes
                actions: list[Action] = [SetTools(settings.tools)] if settings.tools != self.settings.tools else []
                if settings.turn_tuning != self.settings.turn_tuning:
                    actions.insert(0, TuneTurns(settings.turn_tuning))
                if settings.instructions != self.settings.instructions:
                    actions.append(SetInstructions(settings.instructions))
                if settings.turn_detection is not None:
                    self._manual_buffer.clear()
                self.settings = settings
                return [*actions, Send(self._event("session.updated", session=self._session_json()))]
            case AppendAudio(audio=audio):
                return self._append(audio)
            case CommitAudio():
                return self._commit()
            case ClearAudio():
                self._manual_buffer.clear()
                return [Send(self._event("input_audio_buffer.cleared"))]
            case CreateUserText(item_id=item_id, text=text):
                return self._create_text(item_id or self._new_id("item"), text)
            case CreateUserAudio(item_id=item_id, audio=audio):
                return self._create_audio(item_id or self._new_id("item"), audio)
            case CreateToolOutput(item_id=item_id, call_id=call_id, output=output):
                return self._tool_output(item_id or self._new_id("item"), call_id, output)
            case CreateResponse(instructions=instructions):
                return self._create_response(instructions)
            case CancelResponse(response_id=response_id):
                return self._cancel(response_id)
            case TruncateItem():
                return self._truncate(event)
            case DeleteItem(item_id=item_id):
                return self._delete(item_id)

    def _append(self, audio: bytes) -> list[Action]:
        fmt = self.settings.input_format
        pcm = to_pcm16(audio, fmt)
        self._audio_ms += round(samples_in(len(audio), fmt) * 1000 / fmt.rate)
        if self.settings.turn_detection is not None:
            return [FeedAudio(pcm, fmt.rate)]
        if (len(self._manual_buffer) + len(pcm)) / 2 / fmt.rate > MAX_MANUAL_BUFFER_S:
            raise RealtimeError(f"the input audio buffer holds {MAX_MANUAL_BUFFER_S:g} s: commit or clear it",
                                "input_audio_buffer_full", "audio")
        self._manual_buffer += pcm
        return []

    def _commit(self) -> list[Action]:
        if self.settings.turn_detection is not None:
            return [EndAudio()]  # the session ends the turn it hears now; the user item comes from its events
        if not self._manual_buffer:
            raise RealtimeError("the input audio buffer is empty", "input_audio_buffer_commit_empty")
        item = _UserItem(self._new_id("item"), committed=True)
        self._committed_next = item
        pcm, self._manual_buffer = bytes(self._manual_buffer), bytearray()
        added = self._added_user_item(item, [{"type": "input_audio", "transcript": None}])
        committed = self._event("input_audio_buffer.committed", item_id=item.id,
                                previous_item_id=added.event["previous_item_id"])
        return [Send(committed), added, FeedAudio(pcm, self.settings.input_format.rate), EndAudio()]

    def _create_audio(self, item_id: str, audio: bytes) -> list[Action]:
        """A user item of audio: the session hears it as a committed buffer; its answer waits for response.create."""
        fmt = self.settings.input_format
        item = _UserItem(item_id, committed=True, explicit=True)
        self._committed_next = item
        added = self._added_user_item(item, [{"type": "input_audio", "transcript": None}])
        return [added, FeedAudio(to_pcm16(audio, fmt), fmt.rate), EndAudio()]

    def _create_text(self, item_id: str, text: str) -> list[Action]:
        self._pending_texts.append((item_id, text))
        content = [{"type": "input_text", "text": text}]
        added = self._added_user_item(_UserItem(item_id, typed=True), content)
        item = dict(added.event["item"])
        return [added, Send(self._event("conversation.item.done", item=item, previous_item_id=item_id))]

    def _create_response(self, instructions: str | None) -> list[Action]:
        if any(not r.held and not r.cancel_reason for r in self._responses.values()):
            raise RealtimeError("a response is in progress: cancel it first or wait for response.done",
                                "conversation_already_has_active_response")
        # this response's own instructions hold until it ends (`_turn_end` restores the session's)
        prompt: list[Action] = [SetInstructions(instructions)] if instructions is not None else []
        outputs, self._outputs_in = self._outputs_in, False  # in the history already: any answer reads them
        if self._pending_texts:
            texts, self._pending_texts = self._pending_texts, []
            self._typed_next = _UserItem(texts[-1][0], typed=True, committed=True)
            self._own_instructions = instructions is not None
            return [*prompt, SendText(" ".join(text for _, text in texts))]
        held = sorted((r for r in self._responses.values() if r.held), key=lambda r: r.turn)
        if held:
            if instructions is not None:
                raise Unsupported("response.instructions: the answer to those words is already written (the session "
                                  "answers as the turn ends); give them with a typed item, or set them before "
                                  "committing", param="response.instructions")
            return self._release(held[-1])
        if outputs:
            self._credits += 1
            self._own_instructions = instructions is not None
            return [*prompt, AnswerToolResults()]
        if self._committed_next is not None or self._open_spoken_item() is not None:
            self._credits += 1  # the answer to the words just committed is on its way
            self._own_instructions = instructions is not None
            return prompt
        raise RealtimeError("nothing to respond to: add a user message or commit audio first (this server answers "
                            "the user's latest words)", "response_create_nothing_new")

    def _tool_output(self, item_id: str, call_id: str, output: str) -> list[Action]:
        """The output of a call of the client's tool: to the session (the history), and an item of the
        conversation."""
        call_item = self._calls_out.pop(call_id, None)
        if call_item is None:
            raise RealtimeError(f"no function call {call_id!r} of this session is waiting for its output",
                                "invalid_call_id", "item.call_id")
        self._outputs_in = True
        previous, self._last_item_id = self._last_item_id, item_id
        item = {"id": item_id, "object": "realtime.item", "type": "function_call_output", "status": "completed",
                "call_id": call_id, "output": output}
        return [ToolOutput(call_id, output), Send(self._event("conversation.item.added", item=item,
                                                              previous_item_id=previous)),
                Send(self._event("conversation.item.done", item=item, previous_item_id=previous))]

    def _open_spoken_item(self) -> _UserItem | None:
        """The spoken user item of a turn the session has not answered yet."""
        return next((item for item in self._items.values() if not item.typed and not item.closed), None)

    def _cancel(self, response_id: str | None) -> list[Action]:
        for response in self._responses.values():
            if response_id in (None, response.id) and response.cancel_reason is None:
                response.cancel_reason = "client_cancelled"
                return [Interrupt()]
        raise RealtimeError("there is no response in progress to cancel", "response_cancel_not_active",
                            "response_id" if response_id else None)

    def _truncate(self, event: TruncateItem) -> list[Action]:
        if event.content_index != 0:
            raise RealtimeError("an assistant item has one content part (index 0)", param="content_index")
        rate = self.settings.output_format.rate
        played = event.audio_end_ms * self._output_rate // 1000
        running = next((r for r in self._responses.values() if r.item_id == event.item_id), None)
        if running is not None:
            turn, sent_ms = running.turn, running.audio_samples * 1000 // rate
            running.truncated_at = played
        elif self._finished is not None and self._finished[0] == event.item_id:
            _, turn, sent_ms = self._finished
        else:
            raise RealtimeError(f"no assistant item {event.item_id!r} to truncate (only the newest answer can be)",
                                "item_not_found", "item_id")
        if event.audio_end_ms > sent_ms:
            raise RealtimeError(f"audio_end_ms {event.audio_end_ms} is past the {sent_ms} ms of audio sent",
                                param="audio_end_ms")
        truncated = self._event("conversation.item.truncated", item_id=event.item_id, content_index=0,
                                audio_end_ms=event.audio_end_ms)
        return [TruncateHeard(played, turn), Send(truncated)]

    def _delete(self, item_id: str) -> list[Action]:
        for index, (pending_id, _) in enumerate(self._pending_texts):
            if pending_id == item_id:
                del self._pending_texts[index]
                return [Send(self._event("conversation.item.deleted", item_id=item_id))]
        raise Unsupported("only a user message not yet answered can be deleted; the conversation's history is the "
                          "session's own", param="item_id")

    def _added_user_item(self, item: _UserItem, content: list[dict[str, Any]]) -> Send:
        previous, self._last_item_id = self._last_item_id, item.id
        body = {"id": item.id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
                "content": content}
        return Send(self._event("conversation.item.added", item=body, previous_item_id=previous))

    # --- session events ------------------------------------------------------------------------------------------
    def session_event(self, event: ev.Event) -> list[Action]:
        """The server events one session event becomes (most internal events become none)."""
        match event:
            case ev.SpeechStart(turn=turn):
                return self._speech_started(turn)
            case ev.SpeechEnd(turn=turn):
                return self._speech_stopped(turn)
            case ev.Transcript():
                return self._transcript(event)
            case ev.LmStarted(turn=turn):
                return self._response_started(turn)
            case ev.ToolCalled(turn=turn):
                return self._in_response(turn, self._tool_called, event)
            case ev.ToolRequested(turn=turn):
                return self._in_response(turn, self._tool_requested, event)
            case ev.PhraseCommitted(turn=turn, text=text):
                return self._in_response(turn, self._transcript_delta, text)
            case ev.AudioStart(turn=turn, sample_rate=rate):
                return self._in_response(turn, self._audio_start, rate)
            case ev.AudioOut(turn=turn, pcm=pcm):
                return self._in_response(turn, self._audio_delta, pcm)
            case ev.AudioEnd(turn=turn):
                return self._in_response(turn, self._audio_done, None)
            case ev.AnswerDone(turn=turn):
                if (response := self._responses.get(turn)) is not None:
                    response.answer, response.tokens = event.text, event.tokens
                    response.prompt_tokens, response.cached_prompt_tokens = event.prompt_tokens, \
                        event.cached_prompt_tokens
                return []
            case ev.Clear(turn=turn):
                if (response := self._responses.get(turn)) is not None and response.cancel_reason is None:
                    response.cancel_reason = "turn_detected"
                return []
            case ev.TurnEnd(turn=turn):
                return self._turn_end(event)
            case ev.ErrorEvent(turn=turn, code=code, message=message):
                if (response := self._responses.get(turn)) is not None:
                    response.error = {"type": "server_error", "code": code, "message": message}
                return [self.error(RuntimeError(message), code)]
        return []

    def _user_item(self, turn: int, spoken: bool) -> _UserItem:
        item = self._items.get(turn)
        if item is None:
            if spoken:
                item, self._committed_next = self._committed_next or _UserItem(self._new_id("item")), None
            else:
                item, self._typed_next = self._typed_next or _UserItem(self._new_id("item"), typed=True), None
            self._items[turn] = item
            for old in [t for t in self._items if t < turn - 8]:  # a long session keeps only recent turns
                del self._items[old]
        return item

    def _speech_started(self, turn: int) -> list[Action]:
        if self.settings.turn_detection is None and self._committed_next is None and turn not in self._items:
            return []  # manual mode: only a commit makes a user item
        item = self._user_item(turn, spoken=True)
        if self.settings.turn_detection is None or item.explicit:
            return []
        return [Send(self._event("input_audio_buffer.speech_started", audio_start_ms=self._audio_ms,
                                 item_id=item.id))]

    def _speech_stopped(self, turn: int) -> list[Action]:
        item = self._items.get(turn)
        if item is None or self.settings.turn_detection is None or item.explicit:
            return []
        actions: list[Action] = [Send(self._event("input_audio_buffer.speech_stopped", audio_end_ms=self._audio_ms,
                                                  item_id=item.id))]
        if not item.committed:
            item.committed = True
            added = self._added_user_item(item, [{"type": "input_audio", "transcript": None}])
            actions += [Send(self._event("input_audio_buffer.committed", item_id=item.id,
                                         previous_item_id=added.event["previous_item_id"])), added]
        return actions

    def _transcript(self, event: ev.Transcript) -> list[Action]:
        item = self._items.get(event.turn)
        if item is None:
            if not event.final or self._typed_next is None:
                return []
            item = self._user_item(event.turn, spoken=False)  # the typed turn that response.create sent
        if item.typed or not self.settings.transcription:
            return []
        if not event.final:
            if not event.committed.startswith(item.delta_sent) or len(event.committed) == len(item.delta_sent):
                return []
            delta, item.delta_sent = event.committed[len(item.delta_sent):], event.committed
            return [Send(self._event("conversation.item.input_audio_transcription.delta", item_id=item.id,
                                     content_index=0, delta=delta))]
        item.transcript = f"{item.transcript} {event.text.strip()}".strip()
        item.delta_sent = ""
        return [Send(self._event("conversation.item.input_audio_transcription.completed", item_id=item.id,
                                 content_index=0, transcript=item.transcript,
                                 usage={"type": "duration", "seconds": round(self._audio_ms / 1000, 3)}))]

    # --- one response --------------------------------------------------------------------------------------------
    def _response_started(self, turn: int) -> list[Action]:
        user = self._items.get(turn)
        if user is None and self._typed_next is not None:
            user = self._user_item(turn, spoken=False)  # the typed turn's answer came before its transcript
        if user is not None:
            user.closed = True
        typed = user is not None and user.typed
        held = not typed and (not self.settings.creates_responses or (user is not None and user.explicit))
        if self._credits:  # a response.create was waiting for this answer (asked for or not, it answers it)
            self._credits -= 1
            held = False
        for old in [r for r in self._responses.values() if r.held]:
            del self._responses[old.turn]  # an answer nobody asked for, to words the user has since followed
        response = _Response(self._new_id("resp"), self._new_id("item"), turn, held)
        response.own_instructions, self._own_instructions = self._own_instructions, False
        self._responses[turn] = response
        return self._out(response, [
            self._event("response.created", response=self._response_json(response, "in_progress")),
        ])

    def _message_begins(self, response: _Response) -> list[dict[str, Any]]:
        """The assistant message's opening events, before its first content (after any tool calls it made)."""
        if response.message_index is not None:
            return []
        response.message_index = len(response.calls)
        previous, self._last_item_id = self._last_item_id, response.item_id
        item = self._assistant_item(response, "in_progress")
        return [
            self._event("response.output_item.added", response_id=response.id, output_index=response.message_index,
                        item=item),
            self._event("conversation.item.added", item=item, previous_item_id=previous),
            self._event("response.content_part.added", part={"type": "audio", "transcript": ""},
                        **self._where(response)),
        ]

    def _function_call(self, response: _Response, name: str, arguments: str,
                       call_id: str) -> tuple[str, list[dict[str, Any]]]:
        """A function_call item added to the response's output (its arguments streamed whole, the call being
        complete when the session reports it): its id and its events."""
        item_id, index = self._new_id("item"), len(response.calls)
        item = {"id": item_id, "object": "realtime.item", "type": "function_call", "status": "completed",
                "name": name, "arguments": arguments, "call_id": call_id}
        where = {"response_id": response.id, "item_id": item_id, "output_index": index, "call_id": call_id}
        response.calls.append(item)
        previous, self._last_item_id = self._last_item_id, item_id
        opened = {**item, "status": "in_progress", "arguments": ""}
        return item_id, [
            self._event("response.output_item.added", response_id=response.id, output_index=index, item=opened),
            self._event("conversation.item.added", item=opened, previous_item_id=previous),
            self._event("response.function_call_arguments.delta", delta=arguments, **where),
            self._event("response.function_call_arguments.done", arguments=arguments, name=name, **where),
            self._event("response.output_item.done", response_id=response.id, output_index=index, item=item),
            self._event("conversation.item.done", item=item, previous_item_id=previous),
        ]

    def _tool_called(self, response: _Response, call: ev.ToolCalled) -> list[dict[str, Any]]:
        """A tool the session ran for this answer: its function_call item and the function_call_output item with
        what it returned, before the spoken message."""
        if response.message_index is not None:
            return []  # the message has begun: the call is the session's business (it said its result already)
        call_id = self._new_id("call")
        item_id, events = self._function_call(response, call.name, call.arguments, call_id)
        output = {"id": self._new_id("item"), "object": "realtime.item", "type": "function_call_output",
                  "status": "completed", "call_id": call_id,
                  "output": call.result if not call.error else f"error: {call.error}"}
        self._last_item_id = output["id"]
        return [*events, self._event("conversation.item.added", item=output, previous_item_id=item_id),
                self._event("conversation.item.done", item=output, previous_item_id=item_id)]

    def _tool_requested(self, response: _Response, call: ev.ToolRequested) -> list[dict[str, Any]]:
        """A call of the client's tool: its function_call item, which ends the response; the client runs it and
        returns its output by `call_id`."""
        item_id, events = self._function_call(response, call.name, call.arguments, call.call_id)
        response.handed_out = True
        self._calls_out[call.call_id] = item_id
        while len(self._calls_out) > MAX_CALLS_OUT:
            del self._calls_out[next(iter(self._calls_out))]
        return events

    def _release(self, response: _Response) -> list[Action]:
        response.held = False
        events, response.held_events = response.held_events, []
        return [Send(event) for event in events]

    def _out(self, response: _Response, events: list[dict[str, Any]]) -> list[Action]:
        if response.held:
            response.held_events.extend(events)
            return []
        return [Send(event) for event in events]

    def _in_response(self, turn: int, step: Any, value: Any) -> list[Action]:
        response = self._responses.get(turn)
        if response is None:
            return []
        return self._out(response, step(response, value))

    def _where(self, response: _Response) -> dict[str, Any]:
        return {"response_id": response.id, "item_id": response.item_id, "output_index": response.message_index,
                "content_index": 0}

    def _transcript_delta(self, response: _Response, text: str) -> list[dict[str, Any]]:
        begins = self._message_begins(response)
        delta = text if not response.transcript or text[:1].isspace() else " " + text
        response.transcript += delta
        return [*begins, self._event("response.output_audio_transcript.delta", delta=delta, **self._where(response))]

    def _audio_start(self, response: _Response, rate: int) -> list[dict[str, Any]]:
        response.encoder = OutputEncoder(rate, self.settings.output_format)
        return self._message_begins(response)

    def _audio_delta(self, response: _Response, pcm: bytes) -> list[dict[str, Any]]:
        begins = self._message_begins(response)
        if response.encoder is None:
            response.encoder = OutputEncoder(self._output_rate, self.settings.output_format)
        return [*begins, *self._delta(response, response.encoder.push(pcm))]

    def _delta(self, response: _Response, data: str) -> list[dict[str, Any]]:
        if not data:
            return []
        fmt = self.settings.output_format
        response.audio_samples += samples_in(len(data) * 3 // 4 - data.count("=", -2), fmt)
        return [self._event("response.output_audio.delta", delta=data, **self._where(response))]

    def _audio_done(self, response: _Response, _: None) -> list[dict[str, Any]]:
        if response.audio_done:
            return []
        begins = self._message_begins(response)
        response.audio_done = True
        tail = self._delta(response, response.encoder.push(b"", last=True)) if response.encoder else []
        return [*begins, *tail, self._event("response.output_audio.done", **self._where(response))]

    def _turn_end(self, event: ev.TurnEnd) -> list[Action]:
        response = self._responses.pop(event.turn, None)
        actions: list[Action] = []
        user = self._items.get(event.turn)
        if user is not None:
            user.closed = True
        if user is not None and not user.typed and self.settings.transcription and not user.transcript \
                and event.user_text:
            user.transcript = event.user_text
            actions.append(Send(self._event("conversation.item.input_audio_transcription.completed",
                                            item_id=user.id, content_index=0, transcript=event.user_text,
                                            usage={"type": "duration", "seconds": 0.0})))
        if response is None:
            return actions
        if response.held:
            self._responses[event.turn] = response  # finished, still waiting for a response.create
        if event.interrupted and response.cancel_reason is None:
            response.cancel_reason = "turn_detected"
        status = "failed" if response.error else "cancelled" if response.cancel_reason else "completed"
        if response.handed_out and response.message_index is None:  # it ends with the calls: no message
            if response.own_instructions:
                actions.append(SetInstructions(self.settings.instructions))
            done = self._event("response.done", response=self._response_json(response, status))
            return [*actions, *self._out(response, [done])]
        transcript = event.spoken if event.interrupted else (event.answer or response.answer)
        events = self._message_begins(response)
        where = self._where(response)
        events += self._audio_done(response, None)
        events += [
            self._event("response.output_audio_transcript.done", transcript=transcript, **where),
            self._event("response.content_part.done", part={"type": "audio", "transcript": transcript}, **where),
        ]
        item = self._assistant_item(response, "completed" if status == "completed" else "incomplete", transcript)
        events += [
            self._event("response.output_item.done", response_id=response.id, output_index=response.message_index,
                        item=item),
            self._event("conversation.item.done", item=item, previous_item_id=None),
            self._event("response.done", response=self._response_json(response, status, item)),
        ]
        rate = self.settings.output_format.rate
        self._finished = (response.item_id, event.turn, response.audio_samples * 1000 // rate)
        if response.own_instructions:
            actions.append(SetInstructions(self.settings.instructions))
        if response.truncated_at is not None and not event.interrupted:
            # truncated while it ran, yet it ended in full (no cancel): the history keeps what was heard
            actions.append(TruncateHeard(response.truncated_at, event.turn))
        return [*actions, *self._out(response, events)]

    def _assistant_item(self, response: _Response, status: str, transcript: str | None = None) -> dict[str, Any]:
        return {"id": response.item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": status, "content": [{"type": "output_audio", "transcript": transcript}]}

    def _response_json(self, response: _Response, status: str, item: dict[str, Any] | None = None) -> dict[str, Any]:
        details: dict[str, Any] | None = None
        if status == "cancelled":
            details = {"type": "cancelled", "reason": response.cancel_reason}
        elif status == "failed":
            details = {"type": "failed", "error": response.error}
        usage = None
        if status != "in_progress":
            # the LM's own counts, over every round of the answer (a tool's round reads its prompt again); the
            # audio is the voice's, not the model's: text tokens only
            prompt, cached = response.prompt_tokens, response.cached_prompt_tokens
            usage = {"total_tokens": prompt + response.tokens, "input_tokens": prompt,
                     "output_tokens": response.tokens,
                     "input_token_details": {"text_tokens": prompt, "audio_tokens": 0, "cached_tokens": cached},
                     "output_token_details": {"text_tokens": response.tokens, "audio_tokens": 0}}
        return {"id": response.id, "object": "realtime.response", "status": status, "status_details": details,
                "output": [*response.calls, *([item] if item is not None else [])],
                "conversation_id": f"conv_{self.session_id}",
                "output_modalities": ["audio"], "max_output_tokens": "inf", "metadata": None, "usage": usage,
                "audio": {"output": {"format": self.settings.output_format.as_json(), "voice": self.settings.voice}}}
