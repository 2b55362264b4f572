"""The chat-level interface shared by the local diffusion LM and remote OpenAI-compatible endpoints.

The voice pipeline and the HTTP server only see `ChatModel.stream_chat`, which yields one `Draft` per refinement pass.
A `Draft` is text split into pieces that say whether they are final, so speculative TTS can render early drafts and
release audio only for committed text, whatever produced the draft.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from model.decoding.options import AnswerRules, GenerationOptions
from model.decoding.refinement import Refinement

__all__ = [
    "ROLES", "AnswerRules", "BatchesAnswers", "ChatMessage", "ChatModel", "ConstrainsAnswers", "Draft", "DraftPiece",
    "GenerationOptions", "PreparesPrompts", "StandsAside", "TokenizingChatModel",
]

ROLES = ("system", "user", "assistant", "tool")  # "tool": a function's result (model/chat/tools.py)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class DraftPiece:
    """The text of one token (or, for remote drafts, of a span) and whether it is final."""

    text: str
    committed: bool
    confidence: float = 1.0
    tokens: int = 1  # answer tokens behind this text (a character split over several tokens is one piece)


@dataclass(frozen=True, slots=True)
class Draft:
    """The answer after one refinement pass.

    `pieces` run from the start of the answer up to (not including) the first end-of-sequence guess. Committed pieces
    never change in later drafts of the same answer (for masked diffusion; remote endpoints that stream whole drafts
    mark text committed only when it is final).
    """

    step: int
    pieces: tuple[DraftPiece, ...]
    done: bool = False
    finish_reason: str | None = None  # "stop", "length" or "cancelled" once done
    elapsed_s: float = 0.0  # time of this pass
    prompt_tokens: int = 0
    # Of those, how many the model found already encoded in its cache (OpenAI's `cached_tokens`): the prompt cost
    # of this answer is prompt_tokens - cached_prompt_tokens.
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0  # committed answer tokens so far (for usage counts)
    refinement: Refinement | None = None  # the raw pass, for local models
    # The LM's probability that the message ends right after the user's last word (model/decoding/end_of_turn.py):
    # on the first draft, when the model computed it; None otherwise (a remote model that gives no logprobs)
    end_of_turn: float | None = None

    @property
    def text(self) -> str:
        """The whole current draft: committed text followed by the current guess."""
        return "".join(piece.text for piece in self.pieces)

    @property
    def committed_text(self) -> str:
        """The leading run of committed pieces: text that can no longer change."""
        parts: list[str] = []
        for piece in self.pieces:
            if not piece.committed:
                break
            parts.append(piece.text)
        return "".join(parts)


@runtime_checkable
class ChatModel(Protocol):
    """Anything that answers a chat with a stream of drafts: the local diffusion LM or a remote endpoint."""

    name: str

    def stream_chat(
        self,
        messages: Sequence[ChatMessage],
        options: GenerationOptions,
        cancel: threading.Event | None = None,
    ) -> Iterator[Draft]:
        """Yield one `Draft` per refinement pass; the last has `done=True`. Setting `cancel` stops within one pass."""
        ...


@runtime_checkable
class TokenizingChatModel(ChatModel, Protocol):
    """A local `ChatModel` whose prompt can be tokenized and checked before it is queued (the HTTP server refuses a
    too-long request with a 400 before any work, instead of failing inside a stream)."""

    def prompt_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Token ids of the chat, ready for `stream_prompt`; raises `ModelError` for a chat it cannot answer."""
        ...

    def check_context(self, prompt_tokens: int, max_new_tokens: int, limit: int | None = None) -> None:
        """Raise `ContextLengthExceeded` when the prompt and the answer do not fit the context (or `limit`)."""
        ...

    def stream_prompt(
        self, prompt: Sequence[int], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Draft]:
        """`stream_chat` for an already tokenized prompt."""
        ...


@runtime_checkable
class BatchesAnswers(Protocol):
    """A model that decodes several answers in one pass (`DiffusionChatModel` with its batch runner): a server runs up
    to `max_batch` requests at once on it, where a model without it gets one at a time."""

    @property
    def max_batch(self) -> int: ...


@runtime_checkable
class ConstrainsAnswers(Protocol):
    """A model whose answers are held to tool calls and response formats: a local `DiffusionChatModel` whose back end
    masks with the grammar (every decoding mode of the bundled model and of masked checkpoints; not DiffusionGemma's
    own sampler), or a remote endpoint that is asked to (`OpenAIChatModel`: its server enforces them with its own
    grammar engine). The voice session offers its tools only to such a model."""

    @property
    def constrains_answers(self) -> bool: ...


@runtime_checkable
class StandsAside(Protocol):
    """A model that computes in this process and can hold its passes while other work of the process has someone
    waiting on it (`DiffusionChatModel.standing_aside`: a voice answer's first phrase being synthesised, which the
    passes slow when they share the cores); a remote model has nothing to hold."""

    def standing_aside(self, seconds: float) -> AbstractContextManager[None]: ...


@runtime_checkable
class PreparesPrompts(Protocol):
    """A model that can encode, while it is idle, the part of a conversation's next prompt known before the user's
    next words (`DiffusionChatModel.prepare`); a remote model has no such step."""

    def prepare(
        self, messages: Sequence[ChatMessage], cancel: threading.Event | None = None, conversation: str | None = None,
        system_prompt: str | None = None, words: str = "",
    ) -> list[int]:
        """Queue the encoding (with `words`, the next user message's known start); `cancel` drops it while it still
        waits. Returns the tokens queued."""
        ...
