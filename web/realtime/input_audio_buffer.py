"""The input audio buffer's events: audio the client appends and commits (held here under manual turn detection),
and what the session heard of it (speech started and stopped, the committed user item, its transcription)."""

from __future__ import annotations

from voice import events as ev
from web.realtime.actions import Action, EndAudio, FeedAudio, Send
from web.realtime.audio import samples_in, to_pcm16
from web.realtime.client_events import RealtimeError
from web.realtime.translator_state import TranslatorState, UserItem

MAX_MANUAL_BUFFER_S = 60.0  # manual turn detection: the most audio held before a commit


class InputAudioBuffer(TranslatorState):
    """input_audio_buffer.append / commit from the client; speech_started, speech_stopped, committed and the input
    transcription from the session's events."""

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
        item = UserItem(self._new_id("item"), committed=True)
        self._committed_next = item
        pcm, self._manual_buffer = bytes(self._manual_buffer), bytearray()
        added = self._added_user_item(item, [{"type": "input_audio", "transcript": None}])
        committed = self._event("input_audio_buffer.committed", item_id=item.id,
                                previous_item_id=added.event["previous_item_id"])
        return [Send(committed), added, FeedAudio(pcm, self.settings.input_format.rate), EndAudio()]

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
        return [*actions, *self._committed_answer(turn)]

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
