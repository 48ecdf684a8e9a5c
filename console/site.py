"""The console's admin site: Django's admin, its sidebar led by the bot's pages, the task queue's internals
out of sight.

Owns what the sidebar (and the index) list. Invariants: a page is listed only to a user who may open it
(the same permission its view checks, or the model admin's view-or-change permission); django-q2's
queue and schedules are never listed or registered (the dispatcher is the scheduler: a schedule row
would never run), and its task records are not listed (they stay reachable, under their permissions,
for whoever is sent there).
"""

from __future__ import annotations

from django.apps import apps
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

# The bot's pages, in the sidebar's order: (key, name, URL name and the permission its view checks), or
# (key, name, a model's label, None): the model's list, which its admin's view-or-change permission opens.
PAGES = (
    ("dashboard", _("Dashboard"), "console-dashboard", "maibot.view_console"),
    ("chats", _("Chats"), "chat.ChatSession", None),
    ("scheduled", _("Scheduled"), "scheduling.ScheduledMessage", None),
    ("timers", _("Timers"), "scheduling.Timer", None),
    ("plugins", _("Plugins"), "console-plugins", "maibot.view_console"),
    ("models", _("Models"), "console-models", "maibot.test_llm_models"),
    ("config", _("Config"), "console-config", "maibot.change_config"),
    ("logs", _("Logs"), "console-logs", "maibot.view_console"),
    ("api", _("API & MCP"), "chat.ApiToken", None),
    ("connect", _("Connect an adapter"), "console-connect", "maibot.view_console"),
)
# Apps whose pages no list shows: django-q2's task records (the console shows what a task did).
UNLISTED_APPS = {"django_q"}


class ConsoleSite(admin.AdminSite):
    """The admin site every admin page and console page is served by (console.apps.ConsoleAdminConfig)."""

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict]:
        listed = super().get_app_list(request, app_label)
        if app_label is not None:  # one app's own index (a breadcrumb's link) stays
            return listed
        return [app for app in listed if app["app_label"] not in UNLISTED_APPS]

    def each_context(self, request: HttpRequest) -> dict:
        context = super().each_context(request)
        pages = self.console_pages(request)
        if pages["models"]:
            context["available_apps"] = [pages, *context["available_apps"]]
        return context

    def console_pages(self, request: HttpRequest) -> dict:
        """The sidebar's first section: the bot's pages this user may open, as the admin's app list
        describes an app."""
        entries = []
        for key, name, target, perm in PAGES:
            url = self._url_if_allowed(request, target, perm)
            if url:
                entries.append({"name": name, "object_name": key, "admin_url": url, "add_url": None, "view_only": True})
        return {
            "name": _("Console"),
            "app_label": "console",
            "app_url": entries[0]["admin_url"] if entries else "",
            "has_module_perms": bool(entries),
            "models": entries,
        }

    def _url_if_allowed(self, request: HttpRequest, target: str, perm: str | None) -> str | None:
        if perm is not None:
            return reverse(target) if request.user.has_perm(perm) else None
        model = apps.get_model(target)
        model_admin = self._registry.get(model)
        if model_admin is None or not model_admin.has_view_or_change_permission(request):
            return None
        return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist", current_app=self.name)


def unregister_task_queue_internals() -> None:
    """django-q2's queue rows and schedules: internals no operator acts on (unregistered)."""
    from django_q.models import OrmQ, Schedule

    for model in (OrmQ, Schedule):
        if admin.site.is_registered(model):
            admin.site.unregister(model)
