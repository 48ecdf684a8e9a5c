"""Operator console for scheduled messages: list and filter them by fate (the delivery of what they sent),
cancel, reschedule, send now, retry, and resend the ones whose delivery came to nothing."""

from __future__ import annotations

from datetime import datetime

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import ValidationError
from django.db.models import Case, F, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django_q import admin as q_admin
from django_q.models import Failure, Success

from chat.admin import fate_badge
from chat.fate import Fate, sender_fate, sender_fate_expression, sender_fate_q
from core.config import format_instant, format_shown, get_config
from scheduling.admin_actions import ServiceActionsMixin, operator
from scheduling.error_codes import SchedulingError
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import (
    resolve_typed_send_at,
    scheduled_message_cancel,
    scheduled_message_edit_text,
    scheduled_message_reschedule,
    scheduled_message_resend,
    scheduled_message_retry,
    scheduled_message_send_now,
    validate_text,
)


def _shown(value, tz) -> str:
    """A history value as the page shows it: an instant (stored as ISO 8601 text) in the bot's time zone
    in the console's one format; anything else as it is."""
    if isinstance(value, str) and len(value) >= 19 and value[4:5] == "-" and value[10:11] == "T":
        try:
            instant = datetime.fromisoformat(value)
        except ValueError:
            return value
        if instant.tzinfo is not None:
            return format_shown(instant, tz)
    return str(value)


# The history's events and their details' keys, as the page names them (the rows keep the codes).
HISTORY_EVENTS = {
    "created": gettext_lazy("created"),
    "cancelled": gettext_lazy("cancelled"),
    "rescheduled": gettext_lazy("rescheduled"),
    "edited": gettext_lazy("text edited"),
    "send_now": gettext_lazy("sent now"),
    "retried": gettext_lazy("retried"),
    "resent": gettext_lazy("resent"),
    "attempt_failed": gettext_lazy("attempt failed"),
}
HISTORY_DETAILS = {
    "send_at": gettext_lazy("send at"),
    "reason": gettext_lazy("reason"),
    "old": gettext_lazy("was"),
    "new": gettext_lazy("now"),
    "old_text": gettext_lazy("previous text"),
    "previous_error": gettext_lazy("previous error"),
    "previous": gettext_lazy("previous state"),
    "error": gettext_lazy("error"),
    "content_type": gettext_lazy("content type"),
    "format": gettext_lazy("format"),
    "media": gettext_lazy("media"),
}


# Upcoming first (pending, the next due at the top), then everything else newest first.
UPCOMING_FIRST = [
    Case(When(status=ScheduledStatus.PENDING, then=Value(0)), default=Value(1)).asc(),
    Case(When(status=ScheduledStatus.PENDING, then=F("send_at"))).asc(nulls_last=True),
    F("send_at").desc(),
]


class PlatformFilter(admin.SimpleListFilter):
    title = gettext_lazy("platform")
    parameter_name = "platform"

    def lookups(self, request, model_admin):
        platforms = model_admin.get_queryset(request).values_list("session__platform", flat=True).distinct()
        return [(p, p) for p in sorted(set(platforms))]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(session__platform=self.value())
        return queryset


class FateFilter(admin.SimpleListFilter):
    """The status operators see: the task's own until it sent its message, then that message's fate."""

    title = gettext_lazy("status")
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return Fate.choices

    def queryset(self, request, queryset):
        if self.value() in Fate.values:
            return queryset.filter(sender_fate_q("sent_message", "status", [self.value()]))
        return queryset


class LocalDateTimeField(forms.DateTimeField):
    """A time as people type it, read by the bot's own time parser in the bot's time zone (not the server's):
    "明天早上8点", "in 2 hours", or ISO 8601 with or without an offset; validated to be in the future."""

    def to_python(self, value):
        if value in self.empty_values:
            return None
        if isinstance(value, str):
            try:
                return resolve_typed_send_at(value.strip())
            except SchedulingError as exc:
                raise ValidationError(exc.message, code=str(exc.code)) from None
        return super().to_python(value)


TYPED_TIME_HELP = gettext_lazy(
    "As you would say it, in the bot's time zone: 明天早上8点, 10分钟后, in 2 hours, tomorrow 8am, "
    "or a date and time in ISO 8601 (with or without an offset)."
)


class RescheduleForm(forms.Form):
    send_at = LocalDateTimeField(label=gettext_lazy("New send time"), help_text=TYPED_TIME_HELP)


class ScheduledMessageForm(forms.ModelForm):
    """Editing a pending message: its text and time. The time is read in the bot's time zone."""

    send_at = LocalDateTimeField(label=gettext_lazy("Send at"), help_text=TYPED_TIME_HELP)

    class Meta:
        model = ScheduledMessage
        fields = ["message_text", "send_at"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance and self.instance.pk and self.instance.send_at:
            tz = get_config().tzinfo
            self.initial["send_at"] = self.instance.send_at.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S")

    def clean_message_text(self):
        try:
            return validate_text(self.cleaned_data.get("message_text") or "")
        except SchedulingError as exc:
            raise ValidationError(exc.message, code=str(exc.code)) from None


@admin.register(ScheduledMessage)
class ScheduledMessageAdmin(ServiceActionsMixin, admin.ModelAdmin):
    action_noun = gettext_lazy("scheduled message(s)")
    form = ScheduledMessageForm
    list_display = ["id", "badge", "send_at_local", "session_link", "short_text", "created_via", "attempts", "lateness"]
    list_filter = [FateFilter, "chat_type", PlatformFilter, "created_via", ("send_at", admin.DateFieldListFilter)]
    date_hierarchy = "send_at"
    search_fields = ["id", "message_text", "session__session_id", "session__user_id", "session__user_nickname"]
    list_select_related = ["session", "sent_message"]
    ordering = UPCOMING_FIRST
    actions = [
        "cancel_selected", "reschedule_selected", "send_now_selected", "retry_failed_selected", "resend_selected",
    ]  # fmt: skip
    readonly_fields = [
        "id", "session", "chat_type", "badge", "send_at_local", "due_at", "attempts", "last_error", "replace_existing",
        "sent_message", "sent_at", "lateness", "created_at", "updated_at", "created_via", "created_by_tool_call_id",
        "created_by_user", "created_by_token", "origin", "cancelled_at", "cancelled_via", "cancelled_by_tool_call_id",
        "cancelled_by_user", "cancel_reason", "rescheduled_at", "rescheduled_by_user", "history_table",
    ]  # fmt: skip
    fieldsets = [
        (None, {"fields": ["id", "session", "chat_type", "badge", "message_text", "send_at", "send_at_local"]}),
        (
            gettext_lazy("Delivery"),
            {"fields": ["due_at", "attempts", "last_error", "sent_message", "sent_at", "lateness"]},
        ),
        (
            gettext_lazy("Audit"),
            {
                "fields": [
                    "created_at",
                    "updated_at",
                    "created_via",
                    "created_by_tool_call_id",
                    "created_by_user",
                    "created_by_token",
                    "origin",
                    "replace_existing",
                    "cancelled_at",
                    "cancelled_via",
                    "cancelled_by_tool_call_id",
                    "cancelled_by_user",
                    "cancel_reason",
                    "rescheduled_at",
                    "rescheduled_by_user",
                    "history_table",
                ]
            },
        ),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[ScheduledMessage]:
        # The fate as a column too, so the status column sorts by what operators see.
        return super().get_queryset(request).annotate(fate=sender_fate_expression("sent_message", "status"))

    # --- display ----------------------------------------------------------------------------------
    @admin.display(description=gettext_lazy("status"), ordering="fate")
    def badge(self, obj: ScheduledMessage) -> str:
        message = obj.sent_message
        reason = obj.last_error or (message.delivery_error if message is not None else "")
        return fate_badge(sender_fate(obj.status, message), reason=reason)

    @admin.display(description=gettext_lazy("send at (bot time)"), ordering="send_at")
    def send_at_local(self, obj: ScheduledMessage) -> str:
        return format_shown(obj.send_at, get_config().tzinfo) if obj.send_at else "-"

    @admin.display(description=gettext_lazy("session"))
    def session_link(self, obj: ScheduledMessage) -> str:
        url = reverse("admin:chat_chatsession_change", args=[obj.session_id])
        return format_html('<a href="{}">{}</a>', url, str(obj.session))

    @admin.display(description=gettext_lazy("text"))
    def short_text(self, obj: ScheduledMessage) -> str:
        return obj.message_text if len(obj.message_text) <= 60 else obj.message_text[:59] + "…"

    @admin.display(description=gettext_lazy("lateness"))
    def lateness(self, obj: ScheduledMessage) -> str:
        late = obj.lateness_seconds
        return "-" if late is None else f"{late * 1000:.0f} ms"

    @admin.display(description=gettext_lazy("history"))
    def history_table(self, obj: ScheduledMessage) -> SafeString | str:
        if not obj.history:
            return "-"
        tz = get_config().tzinfo
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    _shown(event.get("at", ""), tz),
                    HISTORY_EVENTS.get(event.get("event", ""), event.get("event", "")),
                    event.get("by", ""),
                    ", ".join(
                        f"{HISTORY_DETAILS.get(k, k)}={_shown(v, tz)}"
                        for k, v in event.items()
                        if k not in {"at", "event", "by"}
                    ),
                )
                for event in obj.history
            ),
        )
        head = format_html_join("", "<th>{}</th>", ((h,) for h in (_("when"), _("event"), _("by"), _("details"))))
        return format_html('<table class="history"><tr>{}</tr>{}</table>', head, rows)

    # --- editing: only pending tasks, only through the services -----------------------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # messages are scheduled by the planner or the API, in a chat's context

    def has_change_permission(self, request: HttpRequest, obj: ScheduledMessage | None = None) -> bool:
        if obj is not None and obj.status != ScheduledStatus.PENDING:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: ScheduledMessage | None = None) -> bool:
        return False  # cancel instead: the history stays

    def save_model(self, request, obj: ScheduledMessage, form, change: bool) -> None:
        by = operator(request)
        try:
            if "send_at" in form.changed_data:
                scheduled_message_reschedule(task_id=obj.pk, send_at=form.cleaned_data["send_at"], acted_by=by)
            if "message_text" in form.changed_data:
                scheduled_message_edit_text(task_id=obj.pk, message_text=form.cleaned_data["message_text"], acted_by=by)
        except SchedulingError as exc:
            self.message_user(request, _("Not saved: %(error)s") % {"error": exc.message}, messages.ERROR)

    # --- actions ----------------------------------------------------------------------------------
    def has_send_now_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("scheduling.send_now_scheduledmessage")

    @admin.action(description=gettext_lazy("Cancel selected (pending only)"), permissions=["change"])
    def cancel_selected(self, request, queryset: QuerySet[ScheduledMessage]) -> None:
        by = operator(request)
        self._each(
            request,
            queryset,
            lambda t: scheduled_message_cancel(task_ids=[t.pk], acted_by=by, reason="cancelled by operator"),
            _("Cancelled"),
        )

    @admin.action(description=gettext_lazy("Reschedule selected…"), permissions=["change"])
    def reschedule_selected(self, request, queryset: QuerySet[ScheduledMessage]) -> HttpResponse | None:
        """Two steps: the typed time is resolved and shown with its zone (nothing changes yet); confirming
        sends that resolved instant (ISO 8601 with its offset), so "in 2 hours" does not drift meanwhile."""
        tz = get_config().tzinfo
        form = RescheduleForm(request.POST if "apply" in request.POST else None)
        when = form.cleaned_data["send_at"] if form.is_bound and form.is_valid() else None
        if when is not None and "confirm" in request.POST:
            by = operator(request)
            self._each(
                request,
                queryset,
                lambda t: scheduled_message_reschedule(task_id=t.pk, send_at=when, acted_by=by),
                _("Rescheduled to %(time)s (%(zone)s):") % {"time": format_shown(when, tz), "zone": tz},
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": _("Reschedule scheduled messages"),
            "form": form,
            "tasks": [(task, format_shown(task.send_at, tz)) for task in queryset],
            "resolved": format_shown(when, tz) if when else "",
            "resolved_iso": format_instant(when, tz) if when else "",
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "opts": self.model._meta,
            "time_zone": str(tz),
        }
        return render(request, "admin/scheduling/reschedule.html", context)

    @admin.action(description=gettext_lazy("Send selected now (pending only)"), permissions=["send_now"])
    def send_now_selected(self, request, queryset: QuerySet[ScheduledMessage]) -> None:
        by = operator(request)
        self._each(request, queryset, lambda t: scheduled_message_send_now(task_id=t.pk, acted_by=by), _("Queued now"))

    @admin.action(description=gettext_lazy("Retry selected failed messages"), permissions=["change"])
    def retry_failed_selected(self, request, queryset: QuerySet[ScheduledMessage]) -> None:
        by = operator(request)
        self._each(request, queryset, lambda t: scheduled_message_retry(task_id=t.pk, acted_by=by), _("Retrying"))

    def has_resend_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chat.resend_message")

    @admin.action(description=gettext_lazy("Resend selected (sent but unconfirmed or failed)"), permissions=["resend"])
    def resend_selected(self, request, queryset: QuerySet[ScheduledMessage]) -> None:
        by = operator(request)
        self._each(request, queryset, lambda t: scheduled_message_resend(task_id=t.pk, acted_by=by), _("Resent"))


# django-q2's task admins offer "resubmit" with no permission declared: a view-only operator could run a
# task again. The same admins, with the action needing the change permission.
@admin.action(description=gettext_lazy("Resubmit selected tasks to queue"), permissions=["change"])
def resubmit_task(modeladmin, request, queryset) -> None:
    q_admin.resubmit_task(modeladmin, request, queryset)


for _model, _base in ((Success, q_admin.TaskAdmin), (Failure, q_admin.FailAdmin)):
    admin.site.unregister(_model)
    admin.site.register(_model, type(_base.__name__, (_base,), {"actions": [resubmit_task]}))


# The life loop's admin (timers, inner state, memory, turns) and the MCP servers' admin live with their
# sub-packages; Django's autodiscovery imports only this module.
from scheduling.life import admin as _life_admin  # noqa: E402, F401
from scheduling.mcp import admin as _mcp_admin  # noqa: E402, F401
