"""Tools of an MCP server (`--mcp "COMMAND ARGS"`), started over stdio through the official `mcp` SDK.

A stdio MCP server serves one client, so each voice session starts its own (a server may keep per-user state). The
SDK's `Client` is an async context manager built on anyio task groups, which must be left by the task that entered
them: one task per server holds the connection open (`_serve`) and other tasks send calls through it.

A server that dies (or hangs past `call_timeout_s`) fails the call in flight with a `ToolError`, which the turn speaks
as an apology; the server is marked down, and the next turn's `connect` starts it again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import TextContent

from model.chat.tools import Function, checked_function
from model.decoding.grammar import GrammarError
from voice.cancellation import cancel_and_wait
from voice.errors import ToolError

log = logging.getLogger(__name__)


def _offerable(name: str, description: str, schema: dict[str, Any]) -> Function | None:
    """The tool as a function the model can be held to, or None (logged) when the grammar engine cannot enforce its
    schema: one such tool must not fail every answer that offers the others."""
    try:
        return checked_function(name, description, schema)
    except GrammarError as error:
        log.warning("MCP tool %s is left out: %s", name, error)
        return None


class McpServer:
    """One MCP server process and its tools, for one session."""

    def __init__(self, command: str, connect_timeout_s: float = 10.0, call_timeout_s: float = 30.0) -> None:
        argv = shlex.split(command)
        if not argv:
            raise ValueError("--mcp needs a command")
        self.command = command
        self._params = StdioServerParameters(command=argv[0], args=argv[1:])
        self.connect_timeout_s = connect_timeout_s
        self.call_timeout_s = call_timeout_s
        self.functions: tuple[Function, ...] = ()
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._connecting = asyncio.Lock()  # the session's start and its first turn may both ask

    @property
    def up(self) -> bool:
        return self._client is not None and self._task is not None and not self._task.done()

    async def connect(self) -> None:
        """Start the server (again, when it died) and list its tools; a server that cannot start logs why and
        offers no tools this turn."""
        async with self._connecting:
            if not self.up:
                await self._start()

    async def _start(self) -> None:
        await self.close()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp-{self._params.command}")
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await asyncio.shield(ready)
        except Exception as error:  # an outside program failed to start or to answer: no tools from it this turn
            log.warning("MCP server %r did not start: %s", self.command, error or type(error).__name__)
            await self.close()

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        try:
            async with Client(self._params, read_timeout_seconds=self.call_timeout_s) as client:
                listing = await client.list_tools()
                offered = (_offerable(tool.name, tool.description or "", tool.input_schema) for tool in listing.tools)
                self.functions = tuple(function for function in offered if function is not None)
                self._client = client
                ready.set_result(None)
                await self._stop.wait()
        except Exception as error:  # the process failed to start or died: the next turn starts it again
            if not ready.done():
                ready.set_exception(error)
            else:
                log.warning("MCP server %r stopped: %s", self.command, error)
        finally:
            self._client = None

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Call tool `name`; its text content is the result. A failure of the server is a `ToolError`."""
        client = self._client
        if client is None or not self.up:
            raise ToolError(f"the {name} tool is not available right now")
        try:
            async with asyncio.timeout(self.call_timeout_s):
                result = await client.call_tool(name, arguments)
        except (MCPError, TimeoutError, OSError) as error:
            log.warning("MCP tool %s of %r failed: %s", name, self.command, error or type(error).__name__)
            self._client = None  # down: the next turn restarts the server
            raise ToolError(f"the {name} tool stopped working") from error
        text = "\n".join(part.text for part in result.content if isinstance(part, TextContent)).strip()
        if result.is_error:
            raise ToolError(f"the {name} tool failed: {text or 'no reason given'}")
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content, separators=(",", ":"))
        return text

    async def close(self) -> None:
        """Stop the server process (the SDK's context closes its pipes and terminates it)."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            _, still_running = await asyncio.wait({task}, timeout=5)
            await cancel_and_wait(*still_running)
        self._client = None
