"""Where the bot's MCP endpoint is mounted, without importing it: the mcp SDK is about a fifth of a
process's start-up, so the endpoint's module (and the SDK) is imported at the first request to /mcp,
as the client's is when a [[mcp.servers]] entry first connects."""

PATHS = ("/mcp", "/mcp/")


async def endpoint(scope, receive, send) -> None:
    """ASGI app for /mcp: the bot's MCP endpoint (api.mcp.endpoint), imported on first use."""
    from api.mcp.endpoint import mcp_endpoint

    await mcp_endpoint(scope, receive, send)
