"""What a response holds: the function_call items of the tools it called, then one assistant message whose one audio
content part carries the spoken transcript and the audio, as the session's events arrive."""

from __future__ import annotations

from typing import Any

from voice import events as ev
from web.realtime.audio import OutputEncoder, samples_in
from web.realtime.translator_state import ResponseState, TranslatorState

MAX_CALLS_OUT = 32  # calls of the client's tools waiting for their output (the session keeps as many)


class ResponseOutput:
    """The output events of one response, built from the response's state (not yet sent: the lifecycle holds or
    sends them)."""

    def __init__(self, state: TranslatorState) -> None:
        self.state = state

    def message_begins(self, response: ResponseState) -> list[dict[str, Any]]:
        """The assistant message's opening events, before its first content (after any tool calls it made)."""
        if response.message_index is not None:
            return []
        response.message_index = len(response.calls)
        previous, self.state.last_item_id = self.state.last_item_id, response.item_id
        item = self.assistant_item(response, "in_progress")
        return [
            self.state.event("response.output_item.added", response_id=response.id, output_index=response.message_index,
                             item=item),
            self.state.event("conversation.item.added", item=item, previous_item_id=previous),
            self.state.event("response.content_part.added", part={"type": "audio", "transcript": ""},
                             **self.where(response)),
        ]

    def _function_call(self, response: ResponseState, name: str, arguments: str,
                       call_id: str) -> tuple[str, list[dict[str, Any]]]:
        """A function_call item added to the response's output (its arguments streamed whole, the call being
        complete when the session reports it): its id and its events."""
        item_id, index = self.state.new_id("item"), len(response.calls)
        item = {"id": item_id, "object": "realtime.item", "type": "function_call", "status": "completed",
                "name": name, "arguments": arguments, "call_id": call_id}
        where = {"response_id": response.id, "item_id": item_id, "output_index": index, "call_id": call_id}
        response.calls.append(item)
        previous, self.state.last_item_id = self.state.last_item_id, item_id
        opened = {**item, "status": "in_progress", "arguments": ""}
        return item_id, [
            self.state.event("response.output_item.added", response_id=response.id, output_index=index, item=opened),
            self.state.event("conversation.item.added", item=opened, previous_item_id=previous),
            self.state.event("response.function_call_arguments.delta", delta=arguments, **where),
            self.state.event("response.function_call_arguments.done", arguments=arguments, name=name, **where),
            self.state.event("response.output_item.done", response_id=response.id, output_index=index, item=item),
            self.state.event("conversation.item.done", item=item, previous_item_id=previous),
        ]

    def tool_called(self, response: ResponseState, call: ev.ToolCalled) -> list[dict[str, Any]]:
        """A tool the session ran for this answer: its function_call item and the function_call_output item with
        what it returned, before the spoken message."""
        if response.message_index is not None:
            return []  # the message has begun: the call is the session's business (it said its result already)
        call_id = self.state.new_id("call")
        item_id, events = self._function_call(response, call.name, call.arguments, call_id)
        output = {"id": self.state.new_id("item"), "object": "realtime.item", "type": "function_call_output",
                  "status": "completed", "call_id": call_id,
                  "output": call.result if not call.error else f"error: {call.error}"}
        self.state.last_item_id = output["id"]
        return [*events, self.state.event("conversation.item.added", item=output, previous_item_id=item_id),
                self.state.event("conversation.item.done", item=output, previous_item_id=item_id)]

    def tool_requested(self, response: ResponseState, call: ev.ToolRequested) -> list[dict[str, Any]]:
        """A call of the client's tool: its function_call item, which ends the response; the client runs it and
        returns its output by `call_id`."""
        item_id, events = self._function_call(response, call.name, call.arguments, call.call_id)
        response.handed_out = True
        self.state.calls_out[call.call_id] = item_id
        while len(self.state.calls_out) > MAX_CALLS_OUT:
            del self.state.calls_out[next(iter(self.state.calls_out))]
        return events

    def where(self, response: ResponseState) -> dict[str, Any]:
        return {"response_id": response.id, "item_id": response.item_id, "output_index": response.message_index,
                "content_index": 0}

    def transcript_delta(self, response: ResponseState, text: str) -> list[dict[str, Any]]:
        begins = self.message_begins(response)
        delta = text if not response.transcript or text[:1].isspace() else " " + text
        response.transcript += delta
        return [*begins,
                self.state.event("response.output_audio_transcript.delta", delta=delta, **self.where(response))]

    def audio_start(self, response: ResponseState, rate: int) -> list[dict[str, Any]]:
        response.encoder = OutputEncoder(rate, self.state.settings.output_format)
        return self.message_begins(response)

    def audio_delta(self, response: ResponseState, pcm: bytes) -> list[dict[str, Any]]:
        begins = self.message_begins(response)
        if response.encoder is None:
            response.encoder = OutputEncoder(self.state.output_rate, self.state.settings.output_format)
        return [*begins, *self._delta(response, response.encoder.push(pcm))]

    def _delta(self, response: ResponseState, data: str) -> list[dict[str, Any]]:
        if not data:
            return []
        fmt = self.state.settings.output_format
        response.audio_samples += samples_in(len(data) * 3 // 4 - data.count("=", -2), fmt)
        return [self.state.event("response.output_audio.delta", delta=data, **self.where(response))]

    def audio_done(self, response: ResponseState, _: None) -> list[dict[str, Any]]:
        if response.audio_done:
            return []
        begins = self.message_begins(response)
        response.audio_done = True
        tail = self._delta(response, response.encoder.push(b"", last=True)) if response.encoder else []
        return [*begins, *tail, self.state.event("response.output_audio.done", **self.where(response))]

    def assistant_item(self, response: ResponseState, status: str, transcript: str | None = None) -> dict[str, Any]:
        return {"id": response.item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": status, "content": [{"type": "output_audio", "transcript": transcript}]}
