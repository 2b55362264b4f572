"""Configuration of the OpenAI-compatible server, assembled once from CLI flags and environment variables."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Limits and access rules of one `dlm-serve` process. The defaults are safe for a laptop on loopback.

    `api_key` None means no auth (allowed only on loopback; the CLI enforces that). `model_names` are the ids the
    server answers to; the first is the one `/v1/models` lists first. Empty means "the model's own `name`".
    """

    model_names: tuple[str, ...] = ()
    api_key: str | None = None
    max_body_bytes: int = 1_000_000
    max_queue: int = 16  # generations waiting or running; one more is refused with 503
    max_tokens_limit: int = 512  # the largest max_tokens a request may ask for
    default_max_tokens: int = 128  # used when a request sets neither max_tokens nor max_completion_tokens
    max_messages: int = 256
    max_prompt_chars: int = 32_000  # sum of all message contents
    # prompt + max_tokens, in tokens, when the model's own context is larger: on a laptop CPU a prompt this long
    # already holds the single model for seconds while every other client and voice session waits (see API.md)
    max_context_tokens: int = 4096
    max_stop_sequences: int = 4
    disconnect_poll_s: float = 0.1  # how often a non-streaming request checks that its client is still there

    def __post_init__(self) -> None:
        if min(self.max_body_bytes, self.max_queue, self.max_tokens_limit, self.max_context_tokens) <= 0:
            raise ValueError("max_body_bytes, max_queue, max_tokens_limit and max_context_tokens must be positive")
        if not 0 < self.default_max_tokens <= self.max_tokens_limit:
            raise ValueError("default_max_tokens must be in 1..max_tokens_limit")
