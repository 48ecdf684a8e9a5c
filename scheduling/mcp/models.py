"""What the admin shows of the MCP servers the bot uses (per process); the calls made to the bot's own
endpoint are api.models.McpEndpointCall."""

from __future__ import annotations

from django.db import models


class McpLinkState(models.TextChoices):
    STARTING = "starting", "Starting"
    READY = "ready", "Ready"
    DOWN = "down", "Down (reconnecting)"
    STOPPED = "stopped", "Stopped"


class McpServerState(models.Model):
    """One configured MCP server as one process sees it: connected or not, its tools, its calls."""

    name = models.CharField(max_length=64)
    process = models.CharField(max_length=128)  # host:pid of the process that uses it
    transport = models.CharField(max_length=8)  # stdio | http
    state = models.CharField(max_length=16, choices=McpLinkState.choices, default=McpLinkState.STARTING)
    tools = models.JSONField(default=list, blank=True)  # the names offered to the model
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    connected_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    calls = models.PositiveIntegerField(default=0)
    failed_calls = models.PositiveIntegerField(default=0)
    total_call_ms = models.FloatField(default=0)

    class Meta:
        verbose_name = "MCP server"
        constraints = [models.UniqueConstraint(fields=["name", "process"], name="mcp_server_state_unique")]

    def __str__(self) -> str:
        return f"{self.name} @ {self.process}"

    @property
    def mean_call_ms(self) -> float | None:
        return self.total_call_ms / self.calls if self.calls else None
