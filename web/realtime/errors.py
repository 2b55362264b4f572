"""How the Realtime core refuses a client event: the error it raises (the shell turns it into the Realtime `error`
event) and the small checks that name the offending field."""

from __future__ import annotations

from typing import Any

from voice.errors import ProtocolError


class RealtimeError(ProtocolError):
    """A client event this server refuses: `code` and `param` go into the Realtime error shape, with the id of the
    client's event (`event_id`) when it had one."""

    def __init__(self, message: str, code: str = "invalid_request_error", param: str | None = None,
                 event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.event_id = event_id


class Unsupported(RealtimeError):
    """A well-formed event or field that this server does not implement."""

    def __init__(self, message: str, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message, "unsupported", param, event_id)


def fields(obj: dict[str, Any], where: str, allowed: set[str]) -> None:
    unknown = sorted(k for k in obj if k not in allowed and k not in ("type", "event_id"))
    if unknown:
        names = ", ".join(short(k, 40) for k in unknown[:5])
        raise RealtimeError(f"unknown field(s) in {where}: {names}", "unknown_parameter",
                            param=f"{where}.{short(unknown[0], 40)}")


def short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
