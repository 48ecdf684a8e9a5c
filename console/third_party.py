"""The labels of the third-party apps the console shows, in the operator's language where their own
catalogs have none: django-axes has no Simplified Chinese, Django's admin lacks a few of its newer strings,
and the apps' names (django-q2's comes from settings, axes' is not marked) are plain strings. Marked here
so `make messages` keeps them in the console's catalog, which Django reads before the apps' own
(LOCALE_PATHS); `name_third_party_apps` gives the two apps their names through it."""

from __future__ import annotations

from django.apps import apps
from django.utils.translation import gettext_lazy, gettext_noop

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
]

APP_NAMES = {"axes": gettext_lazy("Login attempts"), "django_q": gettext_lazy("Task queue")}


def name_third_party_apps() -> None:
    """Give the third-party apps the console lists a name in the operator's language."""
    for label, name in APP_NAMES.items():
        if apps.is_installed(label):
            apps.get_app_config(label).verbose_name = name
