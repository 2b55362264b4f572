"""Configuration of the WebSocket server: where it listens, who may connect, and the limits every session lives under.

Defaults are safe for a laptop: loopback only, no token needed, limits that a real microphone never reaches. Listening
elsewhere is an explicit decision (`allow_remote`) and then a token is mandatory, because the socket gives anyone who
reaches it a microphone-to-model pipeline on this machine. A browser on another device also needs HTTPS (`tls_cert`
and `tls_key`, see web/tls.py) before it grants the microphone.

Memory per connection is bounded by these limits: at most `max_queued_messages` received frames of at most
`max_message_bytes` each wait for the session (plus one socket read), and at most `max_queued_audio_s` of speech and
`max_queued_control` messages wait to be sent.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from pathlib import Path

from web.outbound import OutboundLimits
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
    allowed_origins: tuple[str, ...] = ()  # besides the server's own origins (see web.access.own_origins)
    static_dir: Path = STATIC_DIR
    tls_cert: Path | None = None  # PEM certificate chain: serve HTTPS and WSS
    tls_key: Path | None = None

    max_message_bytes: int = 64 * 1024  # larger frames close the socket (1009) before they are buffered
    max_queued_messages: int = 16  # received frames waiting for the session before the socket stops being read
    max_text_chars: int = 2_000
    max_sessions: int = 8
    max_sessions_per_client: int = 3  # per client IP address: one device cannot hold every slot
    max_utterance_s: float = 60.0  # one user utterance; the assistant's turn: SessionConfig.max_turn_seconds
    idle_timeout_s: float = 300.0  # no message at all from the client for this long closes the socket

    audio_realtime_factor: float = 1.5  # sustained audio seconds per wall second a client may send
    audio_burst_s: float = 3.0
    audio_close_after_s: float = 10.0  # seconds of audio dropped before the connection is closed
    max_messages_per_s: float = 100.0
    message_burst: float = 200.0
    messages_close_after: float = 500.0
    # Each typed turn starts an LM answer; a person needs seconds to type one, so these are never reached by hand.
    typed_turn_burst: float = 5.0
    typed_turn_interval_s: float = 2.0  # sustained: one typed turn per interval once the burst is spent

    max_queued_audio_s: float = 60.0  # assistant speech waiting to be sent; the rest of a longer answer is dropped
    max_queued_control: int = 1_000  # JSON messages waiting to be sent; more means the client stopped reading: close
    audio_lead_s: float = 1.0  # speech sent ahead of real time, so a `clear` is never stuck behind seconds of audio

    shutdown_timeout_s: float = 5.0
    # SIGTERM: turns in flight get this long to end before their sessions are closed anyway (web.server.drain)
    drain_timeout_s: float = 30.0

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
        if (self.tls_cert is None) != (self.tls_key is None):
            raise WebConfigError("HTTPS needs both a certificate and its key (--tls-cert and --tls-key)")
        if self.typed_turn_burst < 1:
            raise WebConfigError("typed_turn_burst must be at least 1, or no typed turn could ever be sent")
        if self.audio_lead_s < 0:
            raise WebConfigError("audio_lead_s must not be negative")
        positive = {
            "max_message_bytes": self.max_message_bytes,
            "max_queued_messages": self.max_queued_messages,
            "max_sessions_per_client": self.max_sessions_per_client,
            "max_queued_audio_s": self.max_queued_audio_s,
            "max_queued_control": self.max_queued_control,
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
            "typed_turn_burst": self.typed_turn_burst,
            "typed_turn_interval_s": self.typed_turn_interval_s,
            "shutdown_timeout_s": self.shutdown_timeout_s,
            "drain_timeout_s": self.drain_timeout_s,
        }
        bad = [name for name, value in positive.items() if not value > 0]
        if bad:
            raise WebConfigError(f"these limits must be positive: {', '.join(bad)}")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def scheme(self) -> str:
        """The page's scheme: what a browser shows in the address bar and sends in `Origin`."""
        return "https" if self.tls else "http"

    @property
    def outbound_limits(self) -> OutboundLimits:
        return OutboundLimits(
            max_control_messages=self.max_queued_control, max_audio_s=self.max_queued_audio_s, lead_s=self.audio_lead_s
        )

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

    @property
    def typed_turn_limit(self) -> RateLimit:
        """Typed turns past it are refused one by one with an error; the connection is never closed for them (the
        message limit still covers a flood of frames of any kind)."""
        return RateLimit(
            rate=1.0 / self.typed_turn_interval_s,
            burst=self.typed_turn_burst,
            close_after=math.inf,
            notify_interval_s=0.0,
        )
