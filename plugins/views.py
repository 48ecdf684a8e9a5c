"""The admin's Plugins page (read-only): each plugin of this server process, its state and why."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from plugins import host as plugin_host
from plugins import manifest as mf

VIEW_CONSOLE = "maibot.view_console"


def plugins_view(request: HttpRequest) -> HttpResponse:
    # admin_view() already requires an active staff user; the page also needs the console's permission.
    if not request.user.has_perm(VIEW_CONSOLE):
        raise PermissionDenied
    current = plugin_host.host
    records = sorted(current.records.values(), key=lambda r: r.plugin_id or r.folder.name) if current else []
    return TemplateResponse(
        request,
        "admin/plugins/plugins.html",
        {
            **admin.site.each_context(request),
            "title": "Plugins",
            "records": records,
            "started": current is not None,
            "plugins_dir": plugin_host.plugins_dir(),
            "host_version": mf.HOST_APPLICATION_VERSION,
            "sdk_version": mf.sdk_version() or "(not installed)",
        },
    )
