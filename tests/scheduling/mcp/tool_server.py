"""An MCP server written with the SDK (MCPServer, formerly FastMCP) for the client tests; run as
`python tests/scheduling/mcp/tool_server.py stdio` or `python tests/scheduling/mcp/tool_server.py http PORT`.

Tools: `add` (a + b), `shout` (text in capitals, with the header the HTTP client sent), `slow`
(waits `seconds`, then answers: a call to kill the server in), `fail` (a tool error). With
MCP_TEST_MARKER set, every call appends "<tool> <pid>" to that file, so a test sees what ran.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-tools")


def _mark(name: str) -> None:
    if path := os.environ.get("MCP_TEST_MARKER"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{name} {os.getpid()}\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _mark("add")
    return a + b


@server.tool()
def shout(text: str, ctx: Context) -> str:
    """The text in capitals (and the X-Test header of the request, over HTTP)."""
    _mark("shout")
    headers = ctx.headers or {}
    return text.upper() + (f" [{headers['x-test']}]" if "x-test" in headers else "")


@server.tool()
async def slow(seconds: float) -> str:
    """Wait, then answer."""
    _mark("slow")
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    raise ToolError(reason)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
