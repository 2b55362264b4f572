"""How a /ws connection's session events reach its client: each into the outbound queue's lane it belongs to (audio,
its markers, clear, pause and resume, control messages: web/outbound.py), and errors as protocol v1's `error`
messages. web/server.py's producer and consumer call these; web/protocol.py says what the frames hold.
"""

from __future__ import annotations

import time

from voice import events as ev
from voice.errors import VoiceError
from web import protocol
from web.connection import Connection


def send_error(state: Connection, exc: VoiceError, turn: int | None = None) -> None:
    """`exc` to the client as protocol v1's `error` message (for `turn`, when it is one turn's), counted."""
    if state.metrics is not None:
        state.metrics.error_sent(exc.code)
    state.send(protocol.error_message(exc.code, str(exc), turn))


def queue_event(state: Connection, event: ev.Event) -> None:
    """One session event into the outbound queue, in the lane it belongs to (see web/outbound.py)."""
    out = state.out
    match event:
        case ev.AudioOut(pcm=pcm, turn=turn):
            overflow = out.push_audio(pcm, turn)
            if overflow is not None:
                send_error(state, overflow, turn)
        case ev.AudioStart(turn=turn, sample_rate=rate):
            out.push_audio_marker(protocol.text_frame(event), turn, rate)
        case ev.AudioEnd(turn=turn):
            out.push_audio_marker(protocol.text_frame(event), turn)
        case ev.Clear(turn=turn):
            out.push_clear(protocol.text_frame(event), turn)
        case ev.Pause(turn=turn):
            out.push_pause(protocol.text_frame(event), turn, time.monotonic())
        case ev.Resume(turn=turn):
            out.push_resume(protocol.text_frame(event), turn, time.monotonic())
        case _:
            frame = protocol.encode_event(event)
            if isinstance(frame, str):
                out.push_control(frame)
    state.wake.set()
