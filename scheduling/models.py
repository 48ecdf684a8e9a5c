"""Scheduled messages: text written now, sent as written at send_at."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop

from chat.models import ApiToken, ChatSession, ChatType, Message
from core.config import format_shown, get_config
from scheduling.base import Actor, short_id


def new_task_id() -> str:
    return short_id("sm_")


class ScheduledStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    SENDING = "sending", _("Sending")
    SENT = "sent", _("Sent")
    CANCELLED = "cancelled", _("Cancelled")
    FAILED = "failed", _("Failed")


class ScheduledMessage(models.Model):
    id = models.CharField(primary_key=True, max_length=16, default=new_task_id, editable=False, verbose_name=_("id"))
    session = models.ForeignKey(
        ChatSession, on_delete=models.CASCADE, related_name="scheduled_messages", verbose_name=_("session")
    )
    chat_type = models.CharField(max_length=16, choices=ChatType.choices, verbose_name=_("chat type"))
    message_text = models.TextField(blank=True, verbose_name=_("message text"))
    # Extra segments (e.g. an image from the API); empty means a plain text message.
    segments = models.JSONField(default=list, blank=True, verbose_name=_("segments"))
    send_at = models.DateTimeField(help_text=_("When the message is meant to go out (UTC)."), verbose_name=_("send at"))
    # When the dispatcher should next look at it: send_at, or later after a failed attempt.
    due_at = models.DateTimeField(verbose_name=_("due at"))
    status = models.CharField(
        max_length=16, choices=ScheduledStatus.choices, default=ScheduledStatus.PENDING, verbose_name=_("status")
    )
    replace_existing = models.BooleanField(default=False, verbose_name=_("replace existing"))
    attempts = models.PositiveIntegerField(default=0, verbose_name=_("attempts"))
    last_error = models.TextField(blank=True, verbose_name=_("last error"))
    # The lease of the dispatcher that claimed it; a `sending` row past its lease is taken back.
    claim_token = models.CharField(max_length=32, blank=True, editable=False, verbose_name=_("claim token"))
    lease_until = models.DateTimeField(null=True, blank=True, editable=False, verbose_name=_("lease until"))
    # The instance (maibot.ProcessHeartbeat.instance) of the process that claimed it last: while the row
    # is `sending` and that process's heartbeat has run out, the claim is taken back without waiting out
    # the lease. NULL: never claimed.
    claimed_by = models.CharField(max_length=32, null=True, blank=True, editable=False, verbose_name=_("claimed by"))
    sent_message = models.OneToOneField(
        Message,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="scheduled_message",
        verbose_name=_("sent message"),
    )
    sent_at = models.DateTimeField(null=True, blank=True, verbose_name=_("sent at"))

    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))
    created_via = models.CharField(max_length=16, choices=Actor.choices, verbose_name=_("created via"))
    created_by_tool_call_id = models.CharField(max_length=128, blank=True, verbose_name=_("created by tool call id"))
    created_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("created by user"),
    )
    created_by_token = models.ForeignKey(
        ApiToken,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="scheduled_messages",
        verbose_name=_("created by token"),
    )
    # For API messages: api | scheduler | connector | system.
    origin = models.CharField(max_length=16, blank=True, verbose_name=_("origin"))
    cancelled_at = models.DateTimeField(null=True, blank=True, verbose_name=_("cancelled at"))
    cancelled_via = models.CharField(max_length=16, choices=Actor.choices, blank=True, verbose_name=_("cancelled via"))
    cancelled_by_tool_call_id = models.CharField(
        max_length=128, blank=True, verbose_name=_("cancelled by tool call id")
    )
    cancelled_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("cancelled by user"),
    )
    cancel_reason = models.CharField(max_length=255, blank=True, verbose_name=_("cancel reason"))
    rescheduled_at = models.DateTimeField(null=True, blank=True, verbose_name=_("rescheduled at"))
    rescheduled_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        verbose_name=_("rescheduled by user"),
    )
    # Audit trail: [{"at": iso, "event": "created|cancelled|rescheduled|...", "by": "..."}].
    history = models.JSONField(default=list, blank=True, editable=False, verbose_name=_("history"))

    class Meta:
        verbose_name = _("scheduled message")
        verbose_name_plural = _("scheduled messages")
        ordering = ["send_at"]
        permissions = [("send_now_scheduledmessage", gettext_noop("Can send scheduled messages now"))]
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
