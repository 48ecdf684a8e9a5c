"""What the admin shows of the MCP servers the bot uses (per process); the calls made to the bot's own
endpoint are api.models.McpEndpointCall."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class McpLinkState(models.TextChoices):
    STARTING = "starting", _("Starting")
    READY = "ready", _("Ready")
    DOWN = "down", _("Down (reconnecting)")
    STOPPED = "stopped", _("Stopped")


class McpServerState(models.Model):
    """One configured MCP server as one process sees it: connected or not, its tools, its calls."""

    name = models.CharField(max_length=64, verbose_name=_("name"))
    process = models.CharField(max_length=128, verbose_name=_("process"))  # host:pid of the process that uses it
    transport = models.CharField(max_length=8, verbose_name=_("transport"))  # stdio | http
    state = models.CharField(
        max_length=16, choices=McpLinkState.choices, default=McpLinkState.STARTING, verbose_name=_("state")
    )
    tools = models.JSONField(default=list, blank=True, verbose_name=_("tools"))  # the names offered to the model
    last_error = models.TextField(blank=True, verbose_name=_("last error"))
    last_error_at = models.DateTimeField(null=True, blank=True, verbose_name=_("last error at"))
    connected_at = models.DateTimeField(null=True, blank=True, verbose_name=_("connected at"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))
    calls = models.PositiveIntegerField(default=0, verbose_name=_("calls"))
    failed_calls = models.PositiveIntegerField(default=0, verbose_name=_("failed calls"))
    total_call_ms = models.FloatField(default=0, verbose_name=_("total call ms"))

    class Meta:
        verbose_name = _("MCP server")
        verbose_name_plural = _("MCP servers")
        constraints = [models.UniqueConstraint(fields=["name", "process"], name="mcp_server_state_unique")]

    def __str__(self) -> str:
        return f"{self.name} @ {self.process}"

    @property
    def mean_call_ms(self) -> float | None:
        return self.total_call_ms / self.calls if self.calls else None
