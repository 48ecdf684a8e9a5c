"""api: the bot's doors for outside programs — the proactive message HTTP API (/api/v1/) and the MCP
endpoint (/mcp), both behind the same bearer tokens (api.access), with one error vocabulary (api.errors)."""
