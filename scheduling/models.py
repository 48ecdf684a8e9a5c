"""Scheduled messages: text written now, sent as written at send_at."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from chat.models import ApiToken, ChatSession, ChatType, Message
from core.config import format_shown, get_config
from scheduling.base import Actor, short_id


def new_task_id() -> str:
    return short_id("sm_")


class ScheduledStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"


class ScheduledMessage(models.Model):
    id = models.CharField(primary_key=True, max_length=16, default=new_task_id, editable=False)
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="scheduled_messages")
    chat_type = models.CharField(max_length=16, choices=ChatType.choices)
    message_text = models.TextField(blank=True)
    # Extra segments (e.g. an image from the API); empty means a plain text message.
    segments = models.JSONField(default=list, blank=True)
    send_at = models.DateTimeField(help_text="When the message is meant to go out (UTC).")
    # When the dispatcher should next look at it: send_at, or later after a failed attempt.
    due_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=ScheduledStatus.choices, default=ScheduledStatus.PENDING)
    replace_existing = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    # The lease of the dispatcher that claimed it; a `sending` row past its lease is taken back.
    claim_token = models.CharField(max_length=32, blank=True, editable=False)
    lease_until = models.DateTimeField(null=True, blank=True, editable=False)
    # The instance (maibot.ProcessHeartbeat.instance) of the process that claimed it last: while the row
    # is `sending` and that process's heartbeat has run out, the claim is taken back without waiting out
    # the lease. NULL: never claimed.
    claimed_by = models.CharField(max_length=32, null=True, blank=True, editable=False)
    sent_message = models.OneToOneField(
        Message, null=True, blank=True, on_delete=models.PROTECT, related_name="scheduled_message"
    )
    sent_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_via = models.CharField(max_length=16, choices=Actor.choices)
    created_by_tool_call_id = models.CharField(max_length=128, blank=True)
    created_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_token = models.ForeignKey(
        ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="scheduled_messages"
    )
    # For API messages: api | scheduler | connector | system.
    origin = models.CharField(max_length=16, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancelled_via = models.CharField(max_length=16, choices=Actor.choices, blank=True)
    cancelled_by_tool_call_id = models.CharField(max_length=128, blank=True)
    cancelled_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cancel_reason = models.CharField(max_length=255, blank=True)
    rescheduled_at = models.DateTimeField(null=True, blank=True)
    rescheduled_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Audit trail: [{"at": iso, "event": "created|cancelled|rescheduled|...", "by": "..."}].
    history = models.JSONField(default=list, blank=True, editable=False)

    class Meta:
        ordering = ["send_at"]
        permissions = [("send_now_scheduledmessage", "Can send scheduled messages now")]
        indexes = [
            models.Index(fields=["status", "due_at"], name="scheduled_due_idx"),
            models.Index(fields=["session", "status"], name="scheduled_session_status_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                name="scheduled_sent_has_message",
                condition=~Q(status="sent") | (Q(sent_message__isnull=False) & Q(sent_at__isnull=False)),
            ),
            models.CheckConstraint(
                name="scheduled_sending_has_lease",
                condition=~Q(status="sending") | (Q(lease_until__isnull=False) & ~Q(claim_token="")),
            ),
            models.CheckConstraint(
                name="scheduled_cancelled_has_time",
                condition=~Q(status="cancelled") | Q(cancelled_at__isnull=False),
            ),
            models.CheckConstraint(
                name="scheduled_failed_has_error",
                condition=~Q(status="failed") | ~Q(last_error=""),
            ),
            models.CheckConstraint(
                name="scheduled_has_content",
                condition=~Q(message_text="") | ~Q(segments=[]),
            ),
        ]

    def __str__(self) -> str:
        # In the bot's time zone with its offset, as the rest of the console shows times.
        return f"{self.id} → {self.session} at {format_shown(self.send_at, get_config().tzinfo)}"

    @property
    def lateness_seconds(self) -> float | None:
        if self.sent_at is None:
            return None
        return (self.sent_at - self.send_at).total_seconds()


# The life loop's models (timers, firings, inner state, memory, summaries, notes) and MCP's (server
# states, endpoint calls) live in their sub-packages; importing them here registers them with this app.
from scheduling.life.models import *  # noqa: E402, F403
from scheduling.mcp.models import *  # noqa: E402, F403
