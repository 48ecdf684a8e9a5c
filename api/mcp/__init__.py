"""The bot's own MCP endpoint (/mcp): its server (endpoint.py), tools and resources (endpoint_tools.py),
the tools' arguments (arguments.py), and its lazy mount (mount.py)."""
