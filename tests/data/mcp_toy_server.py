"""A tiny stdio MCP server for the voice session's tests, built on the official `mcp` SDK's server.

    python tests/data/mcp_toy_server.py STARTS_FILE

Each start appends a line to STARTS_FILE (so a test can see a restart). Tools: `shout` (the text in capitals),
`slow_shout` (the same after 0.6 s: a tool long enough for the filler), `tag` (a schema the grammar engine refuses,
so the session must leave it out), `crash` (the process exits mid-call).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("toy")


@server.tool()
def shout(text: str) -> str:
    """Say the text loudly."""
    return text.upper() + "!"


@server.tool()
def slow_shout(text: str) -> str:
    """Say the text loudly, after a while."""
    time.sleep(0.6)
    return text.upper() + "!"


@server.tool()
def tag(labels: set[str]) -> str:
    """Tag with labels (a set: its schema's "uniqueItems" is a keyword the grammar engine cannot enforce)."""
    return ", ".join(sorted(labels))


@server.tool()
def crash() -> str:
    """Stop the server in the middle of the call."""
    os._exit(3)


if __name__ == "__main__":
    with Path(sys.argv[1]).open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    server.run("stdio")
