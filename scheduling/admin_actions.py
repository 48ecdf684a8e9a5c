"""What the scheduling admins share: status badges, the acting operator, service-backed bulk actions."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest
from django.utils.html import format_html

from scheduling.error_codes import SchedulingError
from scheduling.models import Actor, ScheduledStatus
from scheduling.services import ActedBy

STATUS_COLOURS = {
    ScheduledStatus.PENDING: "#2563eb",
    ScheduledStatus.SENDING: "#d97706",
    ScheduledStatus.SENT: "#16a34a",
    ScheduledStatus.CANCELLED: "#6b7280",
    ScheduledStatus.FAILED: "#dc2626",
}


def status_badge(status: str, label: str) -> str:
    return format_html(
        '<span class="mb-badge" style="background:{};color:#fff;padding:2px 8px;border-radius:10px;'
        'font-size:11px;white-space:nowrap">{}</span>',
        STATUS_COLOURS.get(status, "#6b7280"),
        label,
    )


def operator(request: HttpRequest) -> ActedBy:
    return ActedBy(via=Actor.OPERATOR, user=request.user)


class ServiceActionsMixin:
    """Admin actions that call a service for each selected row and report what was done and what
    the service refused (with its reason)."""

    action_errors: tuple[type[Exception], ...] = (SchedulingError,)
    action_noun = "item(s)"

    def _each(self, request, queryset, func, verb: str) -> None:
        done, refused = 0, []
        for obj in queryset:
            try:
                func(obj)
                done += 1
            except self.action_errors as exc:
                refused.append(f"{obj.pk}: {exc.message}")
        if done:
            self.message_user(request, f"{verb} {done} {self.action_noun}.", messages.SUCCESS)
        if refused:
            self.message_user(request, "Skipped " + "; ".join(refused), messages.WARNING)
