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
from voice.turn.tuning import TurnTuning
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
    SessionSettings,
    SessionUpdate,
    TruncateItem,
)
from web.realtime.conversation_items import ConversationItems
from web.realtime.input_audio_buffer import InputAudioBuffer
from web.realtime.response_output import ResponseOutput
from web.realtime.responses import Responses
from web.realtime.translator_state import TranslatorState
from web.realtime.turn_detection import SERVER_TUNING


class RealtimeTranslator:
    """One connection's protocol core. `start()` greets; `client_event` and `session_event` return the actions.

    Its state is one `TranslatorState` (translator_state.py), shared by the objects of the four families of events;
    this class dispatches each event to its family."""

    def __init__(self, session_id: str, output_sample_rate: int, default_instructions: str,
                 settings: SessionSettings | None = None, server_tuning: TurnTuning = SERVER_TUNING) -> None:
        self.state = TranslatorState(session_id, output_sample_rate, default_instructions, settings, server_tuning)
        self.audio = InputAudioBuffer(self.state)
        self.items = ConversationItems(self.state)
        self.responses = Responses(self.state, ResponseOutput(self.state))

    @property
    def settings(self) -> SessionSettings:
        """The session's settings as the client last set them (the shell puts back the old ones when the session
        refuses an update)."""
        return self.state.settings

    @settings.setter
    def settings(self, settings: SessionSettings) -> None:
        self.state.settings = settings

    # --- the greeting and errors ---------------------------------------------------------------------------------
    def start(self) -> list[Action]:
        return [Send(self.state.event("session.created", session=self._session_json()))]

    def _session_json(self) -> dict[str, Any]:
        return self.state.settings.as_json(f"sess_{self.state.session_id}", self.state.default_instructions,
                                           self.state.server_tuning)

    def error(self, err: RealtimeError | Exception, code: str | None = None) -> Send:
        """The Realtime `error` event for `err` (a refused client event, or the session's own failure)."""
        if isinstance(err, RealtimeError):
            kind = "invalid_request_error"
            body = {"type": kind, "code": err.code, "message": str(err), "param": err.param, "event_id": err.event_id}
        else:
            body = {"type": "server_error", "code": code or getattr(err, "code", "server_error"),
                    "message": str(err), "param": None, "event_id": None}
        return Send(self.state.event("error", error=body))

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
                before = self.state.settings
                actions: list[Action] = [SetTools(settings.tools)] if settings.tools != before.tools else []
                if settings.turn_tuning != before.turn_tuning:
                    actions.insert(0, TuneTurns(settings.turn_tuning))
                if settings.instructions != before.instructions:
                    actions.append(SetInstructions(settings.instructions))
                if settings.turn_detection is not None:
                    self.state.manual_buffer.clear()
                self.state.settings = settings
                return [*actions, Send(self.state.event("session.updated", session=self._session_json()))]
            case AppendAudio(audio=audio):
                return self.audio.append(audio)
            case CommitAudio():
                return self.audio.commit()
            case ClearAudio():
                return self.audio.clear()
            case CreateUserText(item_id=item_id, text=text):
                return self.items.create_text(item_id or self.state.new_id("item"), text)
            case CreateUserAudio(item_id=item_id, audio=audio):
                return self.items.create_audio(item_id or self.state.new_id("item"), audio)
            case CreateToolOutput(item_id=item_id, call_id=call_id, output=output):
                return self.items.tool_output(item_id or self.state.new_id("item"), call_id, output)
            case CreateResponse(instructions=instructions):
                return self.responses.create(instructions)
            case CancelResponse(response_id=response_id):
                return self.responses.cancel(response_id)
            case TruncateItem():
                return self.items.truncate(event)
            case DeleteItem(item_id=item_id):
                return self.items.delete(item_id)

    # --- session events ------------------------------------------------------------------------------------------
    def session_event(self, event: ev.Event) -> list[Action]:
        """The server events one session event becomes (most internal events become none)."""
        match event:
            case ev.SpeechStart(turn=turn):
                return self.audio.speech_started(turn)
            case ev.SpeechEnd(turn=turn):
                return self.audio.speech_stopped(turn)
            case ev.Transcript():
                return self.audio.transcript(event)
            case ev.LmStarted(turn=turn):
                return self.responses.started(turn)
            case ev.ToolCalled(turn=turn):
                return self.responses.in_response(turn, self.responses.output.tool_called, event)
            case ev.ToolRequested(turn=turn):
                return self.responses.in_response(turn, self.responses.output.tool_requested, event)
            case ev.PhraseCommitted(turn=turn, text=text):
                return self.responses.in_response(turn, self.responses.output.transcript_delta, text)
            case ev.AudioStart(turn=turn, sample_rate=rate):
                return self.responses.in_response(turn, self.responses.output.audio_start, rate)
            case ev.AudioOut(turn=turn, pcm=pcm):
                return self.responses.in_response(turn, self.responses.output.audio_delta, pcm)
            case ev.AudioEnd(turn=turn):
                return self.responses.in_response(turn, self.responses.output.audio_done, None)
            case ev.AnswerDone(turn=turn):
                if (response := self.state.responses.get(turn)) is not None:
                    response.answer, response.tokens = event.text, event.tokens
                    response.prompt_tokens, response.cached_prompt_tokens = event.prompt_tokens, \
                        event.cached_prompt_tokens
                return []
            case ev.Clear(turn=turn):
                if (response := self.state.responses.get(turn)) is not None and response.cancel_reason is None:
                    response.cancel_reason = "turn_detected"
                return []
            case ev.TurnEnd(turn=turn):
                return self.responses.turn_end(event)
            case ev.ErrorEvent(turn=turn, code=code, message=message):
                if (response := self.state.responses.get(turn)) is not None:
                    response.error = {"type": "server_error", "code": code, "message": message}
                return [self.error(RuntimeError(message), code)]
        return []
