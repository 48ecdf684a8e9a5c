"""The API's own records: idempotent replies and the shared rate limit's windows, both per API token.

The tables kept the names they had in the chat app (Meta.db_table); the token itself (chat.ApiToken)
stays in chat, since scheduled messages and MCP server state below this app refer to it.
"""

from django.db import models

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
