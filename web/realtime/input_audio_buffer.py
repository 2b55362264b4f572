"""The input audio buffer's events: audio the client appends and commits (held here under manual turn detection),
and what the session heard of it (speech started and stopped, the committed user item, its transcription)."""

from __future__ import annotations

from voice import events as ev
from web.realtime.actions import Action, EndAudio, FeedAudio, Send
from web.realtime.audio import samples_in, to_pcm16
from web.realtime.client_events import RealtimeError
from web.realtime.translator_state import TranslatorState, UserItem

MAX_MANUAL_BUFFER_S = 60.0  # manual turn detection: the most audio held before a commit


class InputAudioBuffer:
    """input_audio_buffer.append / commit / clear from the client; speech_started, speech_stopped, committed and the
    input transcription from the session's events."""

    def __init__(self, state: TranslatorState) -> None:
        self.state = state

    def append(self, audio: bytes) -> list[Action]:
        fmt = self.state.settings.input_format
        pcm = to_pcm16(audio, fmt)
        self.state.audio_ms += round(samples_in(len(audio), fmt) * 1000 / fmt.rate)
        if self.state.settings.turn_detection is not None:
            return [FeedAudio(pcm, fmt.rate)]
        if (len(self.state.manual_buffer) + len(pcm)) / 2 / fmt.rate > MAX_MANUAL_BUFFER_S:
            raise RealtimeError(f"the input audio buffer holds {MAX_MANUAL_BUFFER_S:g} s: commit or clear it",
                                "input_audio_buffer_full", "audio")
        self.state.manual_buffer += pcm
        return []

    def commit(self) -> list[Action]:
        if self.state.settings.turn_detection is not None:
            return [EndAudio()]  # the session ends the turn it hears now; the user item comes from its events
        if not self.state.manual_buffer:
            raise RealtimeError("the input audio buffer is empty", "input_audio_buffer_commit_empty")
        item = UserItem(self.state.new_id("item"), committed=True)
        self.state.committed_next = item
        pcm, self.state.manual_buffer = bytes(self.state.manual_buffer), bytearray()
        added = self.state.added_user_item(item, [{"type": "input_audio", "transcript": None}])
        committed = self.state.event("input_audio_buffer.committed", item_id=item.id,
                                     previous_item_id=added.event["previous_item_id"])
        return [Send(committed), added, FeedAudio(pcm, self.state.settings.input_format.rate), EndAudio()]

    def clear(self) -> list[Action]:
        self.state.manual_buffer.clear()
        return [Send(self.state.event("input_audio_buffer.cleared"))]

    def speech_started(self, turn: int) -> list[Action]:
        state = self.state
        if state.settings.turn_detection is None and state.committed_next is None and turn not in state.items:
            return []  # manual mode: only a commit makes a user item
        item = state.user_item(turn, spoken=True)
        if state.settings.turn_detection is None or item.explicit:
            return []
        return [Send(state.event("input_audio_buffer.speech_started", audio_start_ms=state.audio_ms, item_id=item.id))]

    def speech_stopped(self, turn: int) -> list[Action]:
        item = self.state.items.get(turn)
        if item is None or self.state.settings.turn_detection is None or item.explicit:
            return []
        state = self.state
        stopped = state.event("input_audio_buffer.speech_stopped", audio_end_ms=state.audio_ms, item_id=item.id)
        actions: list[Action] = [Send(stopped)]
        if not item.committed:
            item.committed = True
            added = self.state.added_user_item(item, [{"type": "input_audio", "transcript": None}])
            actions += [Send(self.state.event("input_audio_buffer.committed", item_id=item.id,
                                              previous_item_id=added.event["previous_item_id"])), added]
        return [*actions, *self.state.committed_answer(turn)]

    def transcript(self, event: ev.Transcript) -> list[Action]:
        item = self.state.items.get(event.turn)
        if item is None:
            if not event.final or self.state.typed_next is None:
                return []
            item = self.state.user_item(event.turn, spoken=False)  # the typed turn that response.create sent
        if item.typed or not self.state.settings.transcription:
            return []
        if not event.final:
            if not event.committed.startswith(item.delta_sent) or len(event.committed) == len(item.delta_sent):
                return []
            delta, item.delta_sent = event.committed[len(item.delta_sent):], event.committed
            return [Send(self.state.event("conversation.item.input_audio_transcription.delta", item_id=item.id,
                                          content_index=0, delta=delta))]
        item.transcript = f"{item.transcript} {event.text.strip()}".strip()
        item.delta_sent = ""
        return [Send(self.state.event("conversation.item.input_audio_transcription.completed", item_id=item.id,
                                      content_index=0, transcript=item.transcript,
                                 usage={"type": "duration", "seconds": round(self.state.audio_ms / 1000, 3)}))]
