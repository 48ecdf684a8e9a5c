"""The MCP servers the bot uses: their tools offered to the chat planner and the life loop (the bot's own
MCP endpoint, /mcp, is in api.mcp)."""
