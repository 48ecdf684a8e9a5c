"""The labels of the third-party apps the console shows, in the operator's language where their own
catalogs have none: django-axes has no Simplified Chinese, Django's admin lacks a few of its newer strings,
and the apps' names (django-q2's comes from settings, axes' is not marked) are plain strings. Marked here
so `make messages` keeps them in the console's catalog, which Django reads before the apps' own
(LOCALE_PATHS); `name_third_party_apps` gives the two apps their names through it, and django-axes' rows
(whose own names are English sentences) a name in the operator's language and the bot's time zone."""

from __future__ import annotations

from django.apps import apps
from django.utils.translation import gettext, gettext_lazy, gettext_noop

from core.config import get_config
from core.text import format_shown

LABELS = [
    # Django's admin (app list and sidebar, read by screen readers).
    gettext_noop("Model name"),
    gettext_noop("Add link"),
    gettext_noop("Change or view list link"),
    # django-axes (models, columns, filters, its action).
    gettext_noop("access attempt"),
    gettext_noop("access attempts"),
    gettext_noop("access failure"),
    gettext_noop("access failures"),
    gettext_noop("access log"),
    gettext_noop("access logs"),
    gettext_noop("Access lock out"),
    gettext_noop("Attempt Remaining"),
    gettext_noop("Attempt Time"),
    gettext_noop("Clean up expired attempts"),
    gettext_noop("Expires At"),
    gettext_noop("Failed Logins"),
    gettext_noop("Form Data"),
    gettext_noop("GET Data"),
    gettext_noop("HTTP Accept"),
    gettext_noop("IP Address"),
    gettext_noop("Locked Out"),
    gettext_noop("Logout Time"),
    gettext_noop("Meta Data"),
    gettext_noop("Not set"),
    gettext_noop("POST Data"),
    gettext_noop("Path"),
    gettext_noop("Session key hash (sha256)"),
    gettext_noop("User Agent"),
    gettext_noop("Username"),
    gettext_noop("access attempt expiration"),
    gettext_noop("access attempt expirations"),
    gettext_noop("The time when access attempt expires and is no longer valid."),
    # django-q2 (its admin: fields, help texts, columns its zh_Hans catalog lacks).
    gettext_noop("32-character task identifier."),
    gettext_noop("Attempt count"),
    gettext_noop("Cluster"),
    gettext_noop("Cluster key"),
    gettext_noop("Dotted import path to the callable, e.g. myapp.tasks.job."),
    gettext_noop("False if the task raised an exception or timed out."),
    gettext_noop("Function"),
    gettext_noop("Hook"),
    gettext_noop("How many times execution was attempted."),
    gettext_noop("How often this task should be enqueued."),
    gettext_noop("Id of the last task spawned from this schedule (read-only)."),
    gettext_noop("Intended date kwarg"),
    gettext_noop("Keyword arguments"),
    gettext_noop("Last task id"),
    gettext_noop("Lock until"),
    gettext_noop("Name of the cluster that executed this task."),
    gettext_noop("Name of the target cluster"),
    gettext_noop("Optional dotted path to a callback that receives the task result."),
    gettext_noop("Optional group id to aggregate related tasks."),
    gettext_noop("Optional human-readable name for lookup and display."),
    gettext_noop("Optional label to identify this schedule in the admin."),
    gettext_noop("Payload"),
    gettext_noop("Pickled keyword arguments (dict)."),
    gettext_noop("Pickled positional arguments (tuple)."),
    gettext_noop("Pickled return value or error payload."),
    gettext_noop("Prevent any cluster from pulling until"),
    gettext_noop("Queue options"),
    gettext_noop("Short result"),
    gettext_noop("Signed serialized task package (do not edit manually)."),
    gettext_noop("Started at"),
    gettext_noop("Stopped at"),
    gettext_noop("Task id"),
    gettext_noop("Time Taken"),
    gettext_noop("When the worker finished (success or failure)."),
    gettext_noop("When the worker started executing the task."),
    gettext_noop("When this schedule runs next (stored in UTC)."),
    gettext_noop("e.g. module.tasks.function"),
    gettext_noop("e.g. module.tasks.result_function"),
    gettext_noop("success"),
    # Django's add-user page (its zh_Hans catalog has the sentence's older wording only).
    gettext_noop("After you’ve created a user, you’ll be able to edit more user options."),
]

APP_NAMES = {"axes": gettext_lazy("Login attempts"), "django_q": gettext_lazy("Task queue")}


def name_third_party_apps() -> None:
    """Give the third-party apps the console lists a name in the operator's language."""
    for label, name in APP_NAMES.items():
        if apps.is_installed(label):
            apps.get_app_config(label).verbose_name = name


def _axes_row_name(template: str):
    def name(row) -> str:
        when = format_shown(row.attempt_time, get_config().tzinfo) if row.attempt_time else "-"
        return gettext(template) % {"username": row.username or "-", "ip": row.ip_address or "-", "time": when}

    return name


AXES_ROW_NAMES = {
    "AccessAttempt": gettext_noop("Failed logins of %(username)s from %(ip)s (last %(time)s)"),
    "AccessFailureLog": gettext_noop("Failed login of %(username)s from %(ip)s at %(time)s"),
    "AccessLog": gettext_noop("Login of %(username)s from %(ip)s at %(time)s"),
}


def name_axes_rows() -> None:
    """django-axes' rows by names in the operator's language (its own __str__ are English sentences with
    UTC times); what each row holds is unchanged."""
    if not apps.is_installed("axes"):
        return
    for model_name, template in AXES_ROW_NAMES.items():
        apps.get_model("axes", model_name).__str__ = _axes_row_name(template)
