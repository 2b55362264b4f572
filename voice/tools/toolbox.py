"""A session's tools: the built-ins and its MCP servers' tools behind one `call`.

The model only writes calls (model/chat/tools.py's text format); the session runs them here. A call the toolbox
cannot run (an unknown name, arguments that are not JSON, a tool's own failure, a dead MCP server) is a `ToolError`,
which the turn speaks as an apology instead of ending dead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from model.chat import ChatModel, ConstrainsAnswers
from model.chat.tools import Function
from voice.cancellation import cancel_and_wait
from voice.errors import ToolError
from voice.tools.builtin import BuiltinTools
from voice.tools.loop import ClientTools
from voice.tools.mcp import McpServer
from voice.tools.timers import Timers

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolsConfig:
    """`--tools` turns the built-ins on; `--mcp "COMMAND ARGS"` (repeatable) adds each server's tools."""

    builtins: bool = True
    mcp: tuple[str, ...] = ()
    filler_after_s: float = 0.3  # a tool still running after this long gets a spoken filler
    filler: str = "One moment."
    max_rounds: int = 2  # tool rounds in one turn before the model must answer in words

    @property
    def any(self) -> bool:
        return self.builtins or bool(self.mcp)


class Toolbox:
    """The tools of one session. `functions` (re)connects the MCP servers, so a server that died is started again
    at the next turn; `close` stops them."""

    def __init__(self, config: ToolsConfig, timers: Timers | None = None) -> None:
        self.config = config
        self.timers = timers or Timers(time.monotonic)
        self._builtins = BuiltinTools(self.timers) if config.builtins else None
        self._servers = [McpServer(command) for command in config.mcp]
        self._owner: dict[str, BuiltinTools | McpServer] = {}
        self._warming: asyncio.Task[object] | None = None
        # what the last turn offered (the built-ins before the first): the next prompt is encoded ahead with it
        self.offered: tuple[Function, ...] = self._builtins.functions if self._builtins is not None else ()

    async def functions(self) -> tuple[Function, ...]:
        """What the model is offered this turn; a name offered twice keeps its first owner (built-ins first)."""
        sources: list[tuple[BuiltinTools | McpServer, tuple[Function, ...]]] = []
        if self._builtins is not None:
            sources.append((self._builtins, self._builtins.functions))
        for server in self._servers:
            await server.connect()
            sources.append((server, server.functions if server.up else ()))
        owner: dict[str, BuiltinTools | McpServer] = {}  # built whole, then swapped: the calls of a turn may overlap
        offered: list[Function] = []
        for source, functions in sources:
            for function in functions:
                if function.name in owner:
                    log.warning("tool %s is offered twice; the second is left out", function.name)
                    continue
                owner[function.name] = source
                offered.append(function)
        self._owner = owner
        self.offered = tuple(offered)
        return self.offered

    async def call(self, name: str, arguments: str) -> str:
        """Run one call the model wrote (`arguments`: its JSON text); the result text is what the model reads."""
        owner = self._owner.get(name)
        if owner is None:
            raise ToolError(f"I have no tool called {name}")
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise ToolError(f"the {name} tool got arguments I could not read") from error
        if not isinstance(parsed, dict):
            raise ToolError(f"the {name} tool got arguments I could not read")
        if isinstance(owner, McpServer):
            return await owner.call(name, parsed)
        return owner.call(name, parsed)

    def warm(self, name: str) -> None:
        """Start the MCP servers now, in a task (`name`), so the first turn that offers their tools does not wait."""
        if self._warming is None:
            self._warming = asyncio.create_task(self.functions(), name=name)

    async def close(self) -> None:
        await cancel_and_wait(self._warming)
        for server in self._servers:
            await server.close()


def holds_to_calls(lm: ChatModel) -> bool:
    """Whether `lm` can be held to calls of the tools it is offered (a grammar on its answers: `ConstrainsAnswers`)."""
    return isinstance(lm, ConstrainsAnswers) and lm.constrains_answers


def check_client_tools(tools: ClientTools, lm: ChatModel, toolbox: Toolbox | None) -> None:
    """Raise ToolError (naming it) when a session cannot offer a client's `tools`: its model cannot be held to calls,
    or a name is one of the session's own tools (`toolbox`)."""
    if tools.functions and not holds_to_calls(lm):
        raise ToolError(f"{lm.name} cannot be held to tool calls (a remote or diffusion-mode model): no client "
                        "tools can be offered")
    own = {function.name for function in toolbox.offered} if toolbox is not None else set()
    clash = sorted(own & {function.name for function in tools.functions})
    if clash:
        raise ToolError(f"tool {clash[0]} is one of the server's own tools: give yours another name")


def toolbox_for(tools: ToolsConfig | None, lm: ChatModel) -> Toolbox | None:
    """A session's tools, when it has any and its model can be held to calls of them."""
    if tools is None or not tools.any:
        return None
    if not holds_to_calls(lm):
        log.info("no tools: %s cannot constrain its answers to tool calls", lm.name)
        return None
    return Toolbox(tools)
