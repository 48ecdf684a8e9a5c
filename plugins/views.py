"""The admin's Plugins page: each plugin of this server process, its state and why, its runner, and the
operator actions (enable, disable, reload, install dependencies, edit config.toml), each behind its own
permission. The views only translate HTTP to the host's methods."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext
from django.views.decorators.http import require_POST

from plugins import host as plugin_host
from plugins import manifest as mf
from plugins import sandbox
from plugins.install import limits, mib
from plugins.install_views import INSTALL_PLUGIN, RESCAN
from plugins.models import PluginInstall
from plugins.records import PluginState
from plugins.update import installed_plugins

VIEW_CONSOLE = "maibot.view_console"
# Each action and the permission it needs.
ACTIONS = {
    "enable": "plugins.enable_plugin",
    "disable": "plugins.disable_plugin",
    "reload": "plugins.reload_plugin",
    "install-deps": "plugins.install_plugin_dependencies",
}
CHANGE_PLUGIN_CONFIG = "plugins.change_plugin_config"


def _require(request: HttpRequest, perm: str) -> None:
    # admin_view() already requires an active staff user; each page and action needs its permission.
    if not request.user.has_perm(perm):
        raise PermissionDenied


def plugins_view(request: HttpRequest) -> HttpResponse:
    _require(request, VIEW_CONSOLE)
    current = plugin_host.host
    records = sorted(current.records.values(), key=lambda r: r.plugin_id or r.folder.name) if current else []
    allowed = {action for action, perm in ACTIONS.items() if request.user.has_perm(perm)}
    return TemplateResponse(
        request,
        "admin/plugins/plugins.html",
        {
            **admin.site.each_context(request),
            "title": gettext("Plugins"),
            "records": records,
            "started": current is not None,
            "plugins_dir": plugin_host.plugins_dir(),
            "host_version": mf.HOST_APPLICATION_VERSION,
            "sdk_version": mf.sdk_version() or gettext("(not installed)"),
            "allowed": allowed,
            "can_edit_config": request.user.has_perm(CHANGE_PLUGIN_CONFIG),
            # pip's own output may quote anything it was given or found: superusers only (plugins.deps).
            "show_pip_output": request.user.is_superuser,
            "sandbox_state": sandbox.state(),
            "sandbox_problem": bool(sandbox.refusal()) or not sandbox.enabled(),
            "can_install": request.user.has_perm(INSTALL_PLUGIN),
            "updatable": installed_plugins() if request.user.has_perm(INSTALL_PLUGIN) else [],
            "can_rescan": request.user.has_perm(RESCAN),
            "install_limits": {"upload": mib(limits().upload_bytes), "unpacked": mib(limits().unpacked_bytes)},
            "installs": PluginInstall.objects.select_related("user")[:20],
        },
    )


def _record(plugin_id: str):
    current = plugin_host.host
    record = current.records.get(plugin_id) if current else None
    if record is None:
        raise Http404("no such plugin in this server process")
    return current, record


@require_POST
def plugin_action_view(request: HttpRequest, plugin_id: str, action: str) -> HttpResponse:
    perm = ACTIONS.get(action)
    if perm is None:
        raise Http404("no such action")
    _require(request, perm)
    current, _ = _record(plugin_id)
    if action == "enable":
        outcome = current.set_enabled(plugin_id, True)
    elif action == "disable":
        outcome = current.set_enabled(plugin_id, False)
    elif action == "reload":
        outcome = current.reload(plugin_id, source="reload from the admin")
    else:
        outcome = current.install_dependencies(plugin_id)
    (messages.success if outcome.ok else messages.error)(request, f"{plugin_id}: {outcome.message}")
    return redirect("console-plugins")


def plugin_config_view(request: HttpRequest, plugin_id: str) -> HttpResponse:
    """A plugin's config.toml: applied (the plugin reloaded with it) only when its config_model accepts
    it and the plugin loads with it; otherwise the reason is shown and nothing is written."""
    _require(request, CHANGE_PLUGIN_CONFIG)
    current, record = _record(plugin_id)
    if record.state == PluginState.REMOVED:
        raise Http404(record.reason)
    path = record.folder / plugin_host.CONFIG_FILE
    error = ""
    if request.method == "POST":
        # The form posts multipart, so a config of the host's MAX_CONFIG_BYTES stays under Django's
        # DATA_UPLOAD_MAX_MEMORY_SIZE whatever its characters (URL-encoding would triple them).
        text = request.POST.get("toml", "").replace("\r\n", "\n")
        outcome = current.validate_config(plugin_id, text)  # refuses a text over MAX_CONFIG_BYTES
        if outcome.ok:
            saved = gettext("%(plugin)s: config.toml saved and applied (%(outcome)s)")
            messages.success(request, saved % {"plugin": plugin_id, "outcome": outcome.message})
            return redirect("console-plugin-config", plugin_id=plugin_id)
        error = outcome.message
    else:
        try:
            text = path.read_text(encoding="utf-8") if path.is_file() else ""
        except (OSError, UnicodeDecodeError) as exc:
            text, error = "", gettext("config.toml cannot be read: %(error)s") % {"error": exc}
    return TemplateResponse(
        request,
        "admin/plugins/plugin_config.html",
        {
            **admin.site.each_context(request),
            "title": gettext("Plugin config: %(name)s") % {"name": record.name},
            "record": record,
            "path": path,
            "toml": text,
            "error": error,
        },
    )
