"""What the /v1/realtime tests share on the client side: reading a connection of the official `openai` client
(`client.realtime.connect`) up to a given server event."""

from __future__ import annotations

import asyncio


async def until(conn, kind: str, got: list, timeout_s: float = 120.0) -> list:
    """Receive events into `got` until one of type `kind` arrives; returns `got`. The default bound is for real models
    on a busy 2-core machine; AssertionError if the connection ends first."""
    async with asyncio.timeout(timeout_s):
        async for event in conn:
            got.append(event)
            if event.type == kind:
                return got
    raise AssertionError(f"the connection ended before {kind}")
