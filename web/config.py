"""Configuration of the WebSocket server: where it listens, who may connect, and the limits every session lives under.

Defaults are safe for a laptop: loopback only, no token needed, limits that a real microphone never reaches. Listening
elsewhere is an explicit decision (`allow_remote`) and then a token is mandatory, because the socket gives anyone who
reaches it a microphone-to-model pipeline on this machine.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from web.protocol import ProtocolLimits
from web.ratelimit import RateLimit

STATIC_DIR = Path(__file__).resolve().parent / "static"
TOKEN_ENV = "VOICE_ASSISTANT_TOKEN"


class WebConfigError(ValueError):
    """The server was configured in a way that is unsafe or impossible; the message says how to fix it."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class WebConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    allow_remote: bool = False
    token: str | None = None
    allowed_origins: tuple[str, ...] = ()  # besides the server's own http://host:port origins
    static_dir: Path = STATIC_DIR

    max_message_bytes: int = 64 * 1024  # larger frames get an `error` and are dropped
    hard_max_message_bytes: int = 1024 * 1024  # larger frames close the socket (1009) before they are even buffered
    max_text_chars: int = 2_000
    max_sessions: int = 8
    max_utterance_s: float = 60.0  # one user utterance; the assistant's turn: SessionConfig.max_turn_seconds
    idle_timeout_s: float = 300.0  # no message at all from the client for this long closes the socket

    audio_realtime_factor: float = 1.5  # sustained audio seconds per wall second a client may send
    audio_burst_s: float = 3.0
    audio_close_after_s: float = 10.0  # seconds of audio dropped before the connection is closed
    max_messages_per_s: float = 100.0
    message_burst: float = 200.0
    messages_close_after: float = 500.0

    shutdown_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not is_loopback(self.host) and not self.allow_remote:
            raise WebConfigError(
                f"refusing to listen on non-loopback host {self.host!r} without allow_remote "
                "(pass --allow-remote and set a token)"
            )
        if self.allow_remote and not self.token:
            raise WebConfigError(f"allow_remote requires a token (set --token or the {TOKEN_ENV} environment variable)")
        if self.token is not None and len(self.token) < 16:
            raise WebConfigError("the access token must be at least 16 characters")
        if not 0 <= self.port <= 65535:
            raise WebConfigError(f"port {self.port} is out of range")
        if not 0 < self.max_message_bytes <= self.hard_max_message_bytes:
            raise WebConfigError("need 0 < max_message_bytes <= hard_max_message_bytes")
        positive = {
            "max_text_chars": self.max_text_chars,
            "max_sessions": self.max_sessions,
            "max_utterance_s": self.max_utterance_s,
            "idle_timeout_s": self.idle_timeout_s,
            "audio_realtime_factor": self.audio_realtime_factor,
            "audio_burst_s": self.audio_burst_s,
            "audio_close_after_s": self.audio_close_after_s,
            "max_messages_per_s": self.max_messages_per_s,
            "message_burst": self.message_burst,
            "messages_close_after": self.messages_close_after,
            "shutdown_timeout_s": self.shutdown_timeout_s,
        }
        bad = [name for name, value in positive.items() if not value > 0]
        if bad:
            raise WebConfigError(f"these limits must be positive: {', '.join(bad)}")

    @classmethod
    def from_env(cls, **overrides: object) -> WebConfig:
        """Build from keyword overrides, taking the token from the environment when none is given."""
        if overrides.get("token") is None and os.environ.get(TOKEN_ENV):
            overrides["token"] = os.environ[TOKEN_ENV]
        return cls(**overrides)  # type: ignore[arg-type]

    @property
    def protocol_limits(self) -> ProtocolLimits:
        return ProtocolLimits(max_message_bytes=self.max_message_bytes, max_text_chars=self.max_text_chars)

    @property
    def audio_limit(self) -> RateLimit:
        return RateLimit(
            rate=self.audio_realtime_factor, burst=self.audio_burst_s, close_after=self.audio_close_after_s
        )

    @property
    def message_limit(self) -> RateLimit:
        return RateLimit(rate=self.max_messages_per_s, burst=self.message_burst, close_after=self.messages_close_after)
