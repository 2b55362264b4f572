"""The conversation items a client creates, truncates or deletes: typed and spoken user messages, the output of a
call of the client's tool, and the truncation of an assistant message to what was heard."""

from __future__ import annotations

from web.realtime.actions import Action, EndAudio, FeedAudio, Send, ToolOutput, TruncateHeard
from web.realtime.audio import to_pcm16
from web.realtime.client_events import RealtimeError, TruncateItem, Unsupported
from web.realtime.translator_state import TranslatorState, UserItem


class ConversationItems:
    """conversation.item.create, .truncate and .delete."""

    def __init__(self, state: TranslatorState) -> None:
        self.state = state

    def create_audio(self, item_id: str, audio: bytes) -> list[Action]:
        """A user item of audio: the session hears it as a committed buffer; its answer waits for response.create."""
        fmt = self.state.settings.input_format
        item = UserItem(item_id, committed=True, explicit=True)
        self.state.committed_next = item
        added = self.state.added_user_item(item, [{"type": "input_audio", "transcript": None}])
        return [added, FeedAudio(to_pcm16(audio, fmt), fmt.rate), EndAudio()]

    def create_text(self, item_id: str, text: str) -> list[Action]:
        self.state.pending_texts.append((item_id, text))
        content = [{"type": "input_text", "text": text}]
        added = self.state.added_user_item(UserItem(item_id, typed=True), content)
        item = dict(added.event["item"])
        return [added, Send(self.state.event("conversation.item.done", item=item, previous_item_id=item_id))]

    def tool_output(self, item_id: str, call_id: str, output: str) -> list[Action]:
        """The output of a call of the client's tool: to the session (the history), and an item of the
        conversation."""
        call_item = self.state.calls_out.pop(call_id, None)
        if call_item is None:
            raise RealtimeError(f"no function call {call_id!r} of this session is waiting for its output",
                                "invalid_call_id", "item.call_id")
        self.state.outputs_in = True
        previous, self.state.last_item_id = self.state.last_item_id, item_id
        item = {"id": item_id, "object": "realtime.item", "type": "function_call_output", "status": "completed",
                "call_id": call_id, "output": output}
        return [ToolOutput(call_id, output), Send(self.state.event("conversation.item.added", item=item,
                                                                   previous_item_id=previous)),
                Send(self.state.event("conversation.item.done", item=item, previous_item_id=previous))]

    def truncate(self, event: TruncateItem) -> list[Action]:
        if event.content_index != 0:
            raise RealtimeError("an assistant item has one content part (index 0)", param="content_index")
        rate = self.state.settings.output_format.rate
        played = event.audio_end_ms * self.state.output_rate // 1000
        running = next((r for r in self.state.responses.values() if r.item_id == event.item_id), None)
        if running is not None:
            turn, sent_ms = running.turn, running.audio_samples * 1000 // rate
            running.truncated_at = played
        elif self.state.finished is not None and self.state.finished[0] == event.item_id:
            _, turn, sent_ms = self.state.finished
        else:
            raise RealtimeError(f"no assistant item {event.item_id!r} to truncate (only the newest answer can be)",
                                "item_not_found", "item_id")
        if event.audio_end_ms > sent_ms:
            raise RealtimeError(f"audio_end_ms {event.audio_end_ms} is past the {sent_ms} ms of audio sent",
                                param="audio_end_ms")
        truncated = self.state.event("conversation.item.truncated", item_id=event.item_id, content_index=0,
                                     audio_end_ms=event.audio_end_ms)
        return [TruncateHeard(played, turn), Send(truncated)]

    def delete(self, item_id: str) -> list[Action]:
        for index, (pending_id, _) in enumerate(self.state.pending_texts):
            if pending_id == item_id:
                del self.state.pending_texts[index]
                return [Send(self.state.event("conversation.item.deleted", item_id=item_id))]
        raise Unsupported("only a user message not yet answered can be deleted; the conversation's history is the "
                          "session's own", param="item_id")
