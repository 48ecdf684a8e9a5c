"""The API's own records: idempotent replies, the shared rate limit's windows and the MCP endpoint's calls,
all per API token.

The tables kept the names they had in the chat and scheduling apps (Meta.db_table). The token itself
(chat.ApiToken) stays in chat: scheduled messages (scheduling, below this app) refer to it.
"""

from django.db import models
from django.utils import timezone

from chat.models import ApiToken


class IdempotencyRecord(models.Model):
    """The first response to an API request carrying an Idempotency-Key, replayed for repeats."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "chat_idempotencyrecord"
        constraints = [models.UniqueConstraint(fields=["token", "key"], name="idempotency_unique_key")]


class ApiRateWindow(models.Model):
    """Requests one API token made in one minute: the rate limit every server process shares."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="+")
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "chat_apiratewindow"
        constraints = [models.UniqueConstraint(fields=["token", "window_start"], name="api_rate_window_unique")]


class McpEndpointCall(models.Model):
    """One tool call to the bot's own MCP endpoint (/mcp)."""

    token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL)
    tool = models.CharField(max_length=128)
    ok = models.BooleanField()
    error_code = models.CharField(max_length=64, blank=True)
    duration_ms = models.FloatField()
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "scheduling_mcpendpointcall"
        verbose_name = "MCP endpoint call"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.tool} ({'ok' if self.ok else self.error_code})"
