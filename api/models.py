"""The API's own records: idempotent replies, the shared rate limit's windows and the MCP endpoint's calls,
all per API token.

The tables kept the names they had in the chat and scheduling apps (Meta.db_table). The token itself
(chat.ApiToken) stays in chat: scheduled messages (scheduling, below this app) refer to it.
"""

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

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
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
        db_table = "chat_idempotencyrecord"
        constraints = [models.UniqueConstraint(fields=["token", "key"], name="idempotency_unique_key")]


class ApiRateWindow(models.Model):
    """Requests one API token made in one minute: the rate limit every server process shares."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="+")
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = _("API rate window")
        verbose_name_plural = _("API rate windows")
        db_table = "chat_apiratewindow"
        constraints = [models.UniqueConstraint(fields=["token", "window_start"], name="api_rate_window_unique")]


class McpEndpointCall(models.Model):
    """One tool call to the bot's own MCP endpoint (/mcp)."""

    token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, verbose_name=_("token"))
    tool = models.CharField(max_length=128, verbose_name=_("tool"))
    ok = models.BooleanField(verbose_name=_("ok"))
    error_code = models.CharField(max_length=64, blank=True, verbose_name=_("error code"))
    duration_ms = models.FloatField(verbose_name=_("duration ms"))
    created_at = models.DateTimeField(default=timezone.now, db_index=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("MCP endpoint call")
        verbose_name_plural = _("MCP endpoint calls")
        db_table = "scheduling_mcpendpointcall"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.tool} ({'ok' if self.ok else self.error_code})"
