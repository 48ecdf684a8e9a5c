"""The real MCP client (the SDK's ClientSession over its streamable-HTTP transport) for the endpoint tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


@asynccontextmanager
async def mcp_session(base: str, token: str | None) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with the bot's /mcp endpoint, as an agent opens one."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        async with streamable_http_client(f"{base}/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def call(session: ClientSession, name: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """(ok, the result or the error {"code", "message", "field"?}) of one tool call; the text content
    and the structured content must say the same."""
    result = await session.call_tool(name, arguments)
    body = result.structured_content
    assert json.loads(result.content[0].text) == body
    return not result.is_error, body
