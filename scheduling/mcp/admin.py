"""Operator admin for the MCP servers the bot uses (state, tools, last error, calls, latency, per process);
the calls made to the bot's own endpoint (/mcp) are in api.admin."""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from chat.admin import ReadOnlyAdmin, badge
from scheduling.mcp.models import McpLinkState, McpServerState

STATE_COLOURS = {
    McpLinkState.READY: "#15803d",
    McpLinkState.STARTING: "#2563eb",
    McpLinkState.DOWN: "#b91c1c",
    McpLinkState.STOPPED: "#6b7280",
}


@admin.register(McpServerState)
class McpServerStateAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "process",
        "transport",
        "state_badge",
        "tool_count",
        "calls",
        "failed_calls",
        "mean_latency",
        "connected_at",
        "last_error_short",
        "updated_at",
    ]
    list_filter = ["state", "transport", "name"]
    search_fields = ["name", "process", "last_error"]
    fields = [
        "name",
        "process",
        "transport",
        "state",
        "tools",
        "connected_at",
        "calls",
        "failed_calls",
        "mean_latency",
        "last_error",
        "last_error_at",
        "updated_at",
    ]
    readonly_fields = fields

    @admin.display(description=_("State"), ordering="state")
    def state_badge(self, obj: McpServerState):
        return badge(STATE_COLOURS.get(obj.state, "#6b7280"), obj.get_state_display())

    @admin.display(description=_("Tools offered"))
    def tool_count(self, obj: McpServerState) -> int:
        return len(obj.tools or [])

    @admin.display(description=_("Mean call latency"))
    def mean_latency(self, obj: McpServerState) -> str:
        return f"{obj.mean_call_ms:.0f} ms" if obj.mean_call_ms is not None else "—"

    @admin.display(description=_("Last error"))
    def last_error_short(self, obj: McpServerState) -> str:
        return (obj.last_error[:80] + "…") if len(obj.last_error) > 80 else obj.last_error
