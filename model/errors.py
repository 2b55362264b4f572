"""Typed errors raised at the model boundary.

Callers (the voice session, the HTTP server, the CLI) catch `ModelError` and turn it into a clear message; nothing from
deep inside torch or transformers should reach a user as a bare traceback.
"""

from __future__ import annotations


class ModelError(Exception):
    """A model could not be loaded or asked to do something it cannot do (bad path, bad lengths, empty prompt...).

    `code` names the failure for a voice session's `error` event, as `voice.errors.VoiceError.code` does for a
    stage's."""

    code = "model_error"


class GenerationCancelled(ModelError):
    """Generation stopped because its cancel flag was set; raised only where a caller asked for an exception."""


class ContextLengthExceeded(ModelError):
    """The prompt and the answer asked for do not fit the model's context: the request's fault, refused before any
    pass (the API answers 400 `context_length_exceeded`)."""


class LmUnavailable(ModelError):
    """The language-model service (`--llm-url`) cannot be reached, is failing, or is too slow: the turn ends with this
    error and the session goes on; the next turn tries again, so the session recovers once the service is back."""

    code = "lm_unavailable"
