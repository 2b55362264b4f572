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

from typing import Any

from voice import events as ev
from web.realtime.actions import Action, Send, SetInstructions, SetTools, TuneTurns
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
    SessionUpdate,
    TruncateItem,
)
from web.realtime.conversation_items import ConversationItems
from web.realtime.input_audio_buffer import InputAudioBuffer
from web.realtime.responses import Responses


class RealtimeTranslator(InputAudioBuffer, ConversationItems, Responses):
    """One connection's protocol state. `start()` greets; `client_event` and `session_event` return the actions.

    The state is TranslatorState's (translator_state.py); each base class adds the steps of one family of events,
    and this class dispatches each event to its step."""

    # --- the greeting and errors ---------------------------------------------------------------------------------
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
