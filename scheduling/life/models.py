"""The life loop's records: timers and their firings, the inner state, memory slots, session summaries
and scratch notes (models of the `scheduling` app)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext_lazy as _

from chat.models import ChatSession, PlannerCycle
from scheduling.base import Actor, short_id


def new_timer_id() -> str:
    return short_id("tm_")


class TimerStatus(models.TextChoices):
    ACTIVE = "active", _("Active")
    DONE = "done", _("Done")
    CANCELLED = "cancelled", _("Cancelled")
    FAILED = "failed", _("Failed")


class TimerKindChoice(models.TextChoices):
    AFTER = "after", _("After a delay (once)")
    EVERY = "every", _("Every interval")
    ONCE = "once", _("Once at a time")
    CRON = "cron", _("Cron")


class Timer(models.Model):
    """Wakes the bot: at next_fire the dispatcher records a firing and a worker runs a life-loop turn."""

    id = models.CharField(primary_key=True, max_length=16, default=new_timer_id, editable=False, verbose_name=_("id"))
    label = models.CharField(max_length=200, verbose_name=_("label"))
    # What the turn is about; `say:<text>` marks a literal message sent as written (also offline).
    payload = models.TextField(blank=True, verbose_name=_("payload"))
    spec = models.CharField(
        max_length=200,
        help_text=_("As written: 5min, every:1h, once:2026-04-10 09:00, cron:0 8 * * *"),
        verbose_name=_("spec"),
    )
    kind = models.CharField(max_length=8, choices=TimerKindChoice.choices, verbose_name=_("kind"))
    session = models.ForeignKey(
        ChatSession,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="timers",
        help_text=_("Where send_message goes by default; empty for a timer of the bot's own."),
        verbose_name=_("session"),
    )
    next_fire = models.DateTimeField(
        null=True, blank=True, help_text=_("UTC; empty once the timer is over."), verbose_name=_("next fire")
    )
    status = models.CharField(
        max_length=16, choices=TimerStatus.choices, default=TimerStatus.ACTIVE, verbose_name=_("status")
    )
    last_fired_at = models.DateTimeField(null=True, blank=True, verbose_name=_("last fired at"))
    fire_count = models.PositiveIntegerField(default=0, verbose_name=_("fire count"))
    last_error = models.TextField(blank=True, verbose_name=_("last error"))
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
    cancelled_at = models.DateTimeField(null=True, blank=True, verbose_name=_("cancelled at"))
    # Set by the claiming UPDATE so the claimer can read back exactly the rows it advanced.
    fire_token = models.CharField(
        max_length=32, blank=True, editable=False, db_index=True, verbose_name=_("fire token")
    )

    class Meta:
        verbose_name = _("timer")
        verbose_name_plural = _("timers")
        ordering = ["next_fire"]
        permissions = [("fire_timer", gettext_noop("Can fire timers now"))]
        indexes = [
            models.Index(fields=["status", "next_fire"], name="timer_due_idx"),
            models.Index(fields=["session", "status"], name="timer_session_status_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                name="timer_active_has_next_fire", condition=~Q(status="active") | Q(next_fire__isnull=False)
            ),
            models.CheckConstraint(
                name="timer_cancelled_has_time", condition=~Q(status="cancelled") | Q(cancelled_at__isnull=False)
            ),
            models.CheckConstraint(name="timer_has_label", condition=~Q(label="")),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.label} ({self.spec})"

    @property
    def literal_text(self) -> str | None:
        """The text of a `say:` payload, sent as written; None for a payload the model reads."""
        text = self.payload.strip()
        for marker in ("say:", "say："):
            if text.lower().startswith(marker):
                return text[len(marker) :].strip()
        return None


class FiringStatus(models.TextChoices):
    PENDING = "pending", _("Waiting for a worker")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    SKIPPED = "skipped", _("Skipped")
    FAILED = "failed", _("Failed")


class TimerFiring(models.Model):
    """One due instant of a timer, claimed by one dispatcher: the hand-off to a worker's life-loop turn."""

    timer = models.ForeignKey(Timer, on_delete=models.CASCADE, related_name="firings")
    due_at = models.DateTimeField(help_text=_("The instant the timer was due (UTC)."))
    fired_at = models.DateTimeField(help_text=_("When the dispatcher claimed it."))
    status = models.CharField(max_length=8, choices=FiringStatus.choices, default=FiringStatus.PENDING)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cycle = models.ForeignKey(
        "chat.PlannerCycle", null=True, blank=True, on_delete=models.SET_NULL, related_name="timer_firings"
    )
    outcome = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        verbose_name = _("timer firing")
        verbose_name_plural = _("timer firings")
        ordering = ["-due_at"]
        indexes = [models.Index(fields=["status", "fired_at"], name="firing_status_idx")]
        # The database itself refuses a second firing of the same due instant.
        constraints = [models.UniqueConstraint(fields=["timer", "due_at"], name="firing_once_per_instant")]

    def __str__(self) -> str:
        return f"{self.timer_id} @ {self.due_at:%Y-%m-%d %H:%M:%S}"

    @property
    def lateness_seconds(self) -> float:
        return (self.fired_at - self.due_at).total_seconds()


class InnerState(models.Model):
    """The bot's own persistent note about its current situation (one row; history in revisions)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False, verbose_name=_("id"))
    text = models.TextField(blank=True, verbose_name=_("text"))
    updated_at = models.DateTimeField(null=True, blank=True, verbose_name=_("updated at"))
    updated_by = models.CharField(max_length=160, blank=True, verbose_name=_("updated by"))

    class Meta:
        verbose_name = _("inner state")
        verbose_name_plural = _("inner state")
        constraints = [models.CheckConstraint(name="inner_state_single_row", condition=Q(id=1))]

    def __str__(self) -> str:
        return gettext("Inner state")


class InnerStateRevision(models.Model):
    """One change of the inner state: the new text, who made it and when."""

    text = models.TextField(blank=True)
    previous_text = models.TextField(blank=True)
    created_at = models.DateTimeField()
    via = models.CharField(max_length=16)  # life | operator | system
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cycle = models.ForeignKey("chat.PlannerCycle", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    tool_call_id = models.CharField(max_length=128, blank=True)

    class Meta:
        verbose_name = _("inner state revision")
        verbose_name_plural = _("inner state revisions")
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return gettext("inner state at %(time)s by %(via)s") % {
            "time": f"{self.created_at:%Y-%m-%d %H:%M:%S}",
            "via": self.via,
        }


class MemorySlot(models.Model):
    """A short persistent fact the model keeps: global (no session) or about one chat."""

    session = models.ForeignKey(
        ChatSession,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="memory_slots",
        verbose_name=_("session"),
    )
    key = models.CharField(max_length=64, verbose_name=_("key"))
    content = models.TextField(verbose_name=_("content"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))
    updated_via = models.CharField(max_length=16, blank=True, verbose_name=_("updated via"))
    updated_by_tool_call_id = models.CharField(max_length=128, blank=True, verbose_name=_("updated by tool call id"))

    class Meta:
        verbose_name = _("memory slot")
        verbose_name_plural = _("memory slots")
        ordering = ["key"]
        constraints = [
            models.UniqueConstraint(fields=["key"], condition=Q(session__isnull=True), name="memory_global_key_unique"),
            models.UniqueConstraint(
                fields=["session", "key"], condition=Q(session__isnull=False), name="memory_session_key_unique"
            ),
            models.CheckConstraint(name="memory_has_key", condition=~Q(key="")),
            models.CheckConstraint(name="memory_has_content", condition=~Q(content="")),
        ]

    def __str__(self) -> str:
        return f"{self.key}: {self.content[:40]}"


class SessionSummary(models.Model):
    """The rolling summary of a long conversation, refreshed by the model every N new messages."""

    session = models.OneToOneField(
        ChatSession, on_delete=models.CASCADE, related_name="summary", verbose_name=_("session")
    )
    text = models.TextField(blank=True, verbose_name=_("text"))
    # The last message folded into the summary; newer ones are what the next refresh reads.
    last_message_id = models.BigIntegerField(default=0, verbose_name=_("last message id"))
    refreshed_at = models.DateTimeField(null=True, blank=True, verbose_name=_("refreshed at"))
    refresh_requested_at = models.DateTimeField(null=True, blank=True, verbose_name=_("refresh requested at"))
    error = models.TextField(blank=True, verbose_name=_("error"))

    class Meta:
        verbose_name = _("session summary")
        verbose_name_plural = _("session summaries")

    def __str__(self) -> str:
        return gettext("summary of %(session)s") % {"session": self.session}


class ScratchNote(models.Model):
    """A working note for the current task in one chat (the `note` tool); cleared with `clear_notes`."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="scratch_notes")
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    tool_call_id = models.CharField(max_length=128, blank=True)

    class Meta:
        verbose_name = _("scratch note")
        verbose_name_plural = _("scratch notes")
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.text[:40]


class LifeTurn(PlannerCycle):
    """Life-loop turns (PlannerCycle rows of kind life), for the admin."""

    class Meta:
        verbose_name = _("life-loop turn")
        verbose_name_plural = _("life-loop turns")
        proxy = True
