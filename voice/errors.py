"""Typed errors at the voice pipeline's stage boundaries.

Each carries a stable `code` that becomes the `code` of an `error` event or WebSocket message. A stage that raises one
of these ends the current turn (or frame), never the session.
"""

from __future__ import annotations


class VoiceError(Exception):
    code = "internal_error"


class AudioFormatError(VoiceError):
    """Audio that is not what it claims to be: wrong rate, odd-length PCM, corrupt or empty WAV, non-audio bytes."""

    code = "bad_audio"


class ASRError(VoiceError):
    code = "asr_failed"


class TTSError(VoiceError):
    code = "tts_failed"


class ProtocolError(VoiceError):
    """A client broke the session's or the WebSocket's input contract (empty text turn, closed session, invalid
    JSON, unknown type...). The WebSocket's own limits are `web.protocol.LimitExceeded`."""

    code = "protocol_error"


class NoAudioDevice(VoiceError):
    code = "no_audio_device"


class ToolError(VoiceError):
    """A tool the session runs (voice/tools/) could not do what the model asked. The message is said to the user
    ("Sorry, <message>."), so it is written as speech: short, no code, no traceback."""

    code = "tool_error"
