"""A response's lifecycle: response.create and response.cancel from the client; created when the session starts an
answer, held unseen until a response.create asks for it where the API leaves that to the client, done when the turn
ends (completed, cancelled or failed, with its usage)."""

from __future__ import annotations

from typing import Any

from voice import events as ev
from web.realtime.actions import Action, AnswerToolResults, Interrupt, Send, SendText, SetInstructions, TruncateHeard
from web.realtime.client_events import RealtimeError, Unsupported
from web.realtime.response_output import ResponseOutput
from web.realtime.translator_state import ResponseState, TranslatorState, UserItem


class Responses:
    """response.create / response.cancel, and response.created / response.done from the session's turns; the
    events inside a response are `output`'s."""

    def __init__(self, state: TranslatorState, output: ResponseOutput) -> None:
        self.state = state
        self.output = output

    def create(self, instructions: str | None) -> list[Action]:
        if any(not r.held and not r.cancel_reason for r in self.state.responses.values()):
            raise RealtimeError("a response is in progress: cancel it first or wait for response.done",
                                "conversation_already_has_active_response")
        # this response's own instructions hold until it ends (`_turn_end` restores the session's)
        prompt: list[Action] = [SetInstructions(instructions)] if instructions is not None else []
        outputs, self.state.outputs_in = self.state.outputs_in, False  # in the history already: any answer reads them
        if self.state.pending_texts:
            texts, self.state.pending_texts = self.state.pending_texts, []
            self.state.typed_next = UserItem(texts[-1][0], typed=True, committed=True)
            self.state.own_instructions = instructions is not None
            return [*prompt, SendText(" ".join(text for _, text in texts))]
        held = sorted((r for r in self.state.responses.values() if r.held), key=lambda r: r.turn)
        if held:
            if instructions is not None:
                raise Unsupported("response.instructions: the answer to those words is already written (the session "
                                  "answers as the turn ends); give them with a typed item, or set them before "
                                  "committing", param="response.instructions")
            return self._release(held[-1])
        if outputs:
            self.state.credits += 1
            self.state.own_instructions = instructions is not None
            return [*prompt, AnswerToolResults()]
        if self.state.committed_next is not None or self.state.open_spoken_item() is not None:
            self.state.credits += 1  # the answer to the words just committed is on its way
            self.state.own_instructions = instructions is not None
            return prompt
        raise RealtimeError("nothing to respond to: add a user message or commit audio first (this server answers "
                            "the user's latest words)", "response_create_nothing_new")

    def cancel(self, response_id: str | None) -> list[Action]:
        for response in self.state.responses.values():
            if response_id in (None, response.id) and response.cancel_reason is None:
                response.cancel_reason = "client_cancelled"
                return [Interrupt()]
        raise RealtimeError("there is no response in progress to cancel", "response_cancel_not_active",
                            "response_id" if response_id else None)

    def started(self, turn: int) -> list[Action]:
        user = self.state.items.get(turn)
        if user is None and self.state.typed_next is not None:
            user = self.state.user_item(turn, spoken=False)  # the typed turn's answer came before its transcript
        if user is not None:
            user.closed = True
        typed = user is not None and user.typed
        held = not typed and (not self.state.settings.creates_responses or (user is not None and user.explicit))
        if self.state.credits:  # a response.create was waiting for this answer (asked for or not, it answers it)
            self.state.credits -= 1
            held = False
        for old in [r for r in self.state.responses.values() if r.held]:
            del self.state.responses[old.turn]  # an answer nobody asked for, to words the user has since followed
        response = ResponseState(self.state.new_id("resp"), self.state.new_id("item"), turn, held)
        spoken_uncommitted = user is not None and not user.committed
        response.before_commit = spoken_uncommitted and self.state.settings.turn_detection is not None
        response.own_instructions, self.state.own_instructions = self.state.own_instructions, False
        self.state.responses[turn] = response
        return self._out(response, [
            self.state.event("response.created", response=self._response_json(response, "in_progress")),
        ])

    def _release(self, response: ResponseState) -> list[Action]:
        response.held = False
        if response.before_commit:
            return []  # its user item's commit sends them (`_committed_answer`)
        return self.state.send_held(response)

    def _out(self, response: ResponseState, events: list[dict[str, Any]]) -> list[Action]:
        if response.held or response.before_commit:
            response.held_events.extend(events)
            return []
        return [Send(event) for event in events]

    def in_response(self, turn: int, step: Any, value: Any) -> list[Action]:
        response = self.state.responses.get(turn)
        if response is None:
            return []
        return self._out(response, step(response, value))

    def turn_end(self, event: ev.TurnEnd) -> list[Action]:
        response = self.state.responses.pop(event.turn, None)
        actions: list[Action] = []
        user = self.state.items.get(event.turn)
        if user is not None:
            user.closed = True
        if user is not None and not user.typed and self.state.settings.transcription and not user.transcript \
                and event.user_text:
            user.transcript = event.user_text
            actions.append(Send(self.state.event("conversation.item.input_audio_transcription.completed",
                                                 item_id=user.id, content_index=0, transcript=event.user_text,
                                            usage={"type": "duration", "seconds": 0.0})))
        if response is None:
            return actions
        if response.held:
            self.state.responses[event.turn] = response  # finished, still waiting for a response.create
        if event.interrupted and response.cancel_reason is None:
            response.cancel_reason = "turn_detected"
        status = "failed" if response.error else "cancelled" if response.cancel_reason else "completed"
        if response.handed_out and response.message_index is None:  # it ends with the calls: no message
            if response.own_instructions:
                actions.append(SetInstructions(self.state.settings.instructions))
            done = self.state.event("response.done", response=self._response_json(response, status))
            return [*actions, *self._out(response, [done])]
        transcript = event.spoken if event.interrupted else (event.answer or response.answer)
        events = self.output.message_begins(response)
        where = self.output.where(response)
        events += self.output.audio_done(response, None)
        events += [
            self.state.event("response.output_audio_transcript.done", transcript=transcript, **where),
            self.state.event("response.content_part.done", part={"type": "audio", "transcript": transcript}, **where),
        ]
        item = self.output.assistant_item(response, "completed" if status == "completed" else "incomplete", transcript)
        events += [
            self.state.event("response.output_item.done", response_id=response.id, output_index=response.message_index,
                             item=item),
            self.state.event("conversation.item.done", item=item, previous_item_id=None),
            self.state.event("response.done", response=self._response_json(response, status, item)),
        ]
        rate = self.state.settings.output_format.rate
        self.state.finished = (response.item_id, event.turn, response.audio_samples * 1000 // rate)
        if response.own_instructions:
            actions.append(SetInstructions(self.state.settings.instructions))
        if response.truncated_at is not None and not event.interrupted:
            # truncated while it ran, yet it ended in full (no cancel): the history keeps what was heard
            actions.append(TruncateHeard(response.truncated_at, event.turn))
        return [*actions, *self._out(response, events)]

    def _response_json(self, response: ResponseState, status: str,
                       item: dict[str, Any] | None = None) -> dict[str, Any]:
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
                "conversation_id": f"conv_{self.state.session_id}",
                "output_modalities": ["audio"], "max_output_tokens": "inf", "metadata": None, "usage": usage,
                "audio": {"output": {"format": self.state.settings.output_format.as_json(),
                                     "voice": self.state.settings.voice}}}
