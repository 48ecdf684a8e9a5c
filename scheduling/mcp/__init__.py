"""The Model Context Protocol both ways: the bot's own MCP endpoint (/mcp) and the MCP servers it uses."""
