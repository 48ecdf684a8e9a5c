"""What the scheduling admins share: status badges, the acting operator, service-backed bulk actions."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from chat.admin import badge
from chat.fate import FATE_COLOURS
from scheduling.error_codes import SchedulingError
from scheduling.models import Actor
from scheduling.services import ActedBy


def status_badge(status: str, label: str) -> str:
    """A badge in the colour of the fate `status` names (the fates' colours are chat's)."""
    return badge(FATE_COLOURS.get(status, "#6b7280"), label)


def operator(request: HttpRequest) -> ActedBy:
    return ActedBy(via=Actor.OPERATOR, user=request.user)


class ServiceActionsMixin:
    """Admin actions that call a service for each selected row and report what was done and what
    the service refused (with its reason)."""

    action_errors: tuple[type[Exception], ...] = (SchedulingError,)
    action_noun = gettext_lazy("item(s)")

    def _each(self, request, queryset, func, verb: str) -> None:
        done, refused = 0, []
        for obj in queryset:
            try:
                func(obj)
                done += 1
            except self.action_errors as exc:
                refused.append(f"{obj.pk}: {exc.message}")
        if done:
            done_text = _("%(verb)s %(count)d %(noun)s.") % {"verb": verb, "count": done, "noun": self.action_noun}
            self.message_user(request, done_text, messages.SUCCESS)
        if refused:
            self.message_user(request, _("Skipped %(refused)s") % {"refused": "; ".join(refused)}, messages.WARNING)
