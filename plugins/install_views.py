"""The Plugins page's Install form (a zip upload or a git URL, permission plugins.install_plugin) and its
Rescan button (plugins.reload_plugin). Every attempt is recorded (plugins.models.PluginInstall: who,
when, from where, what came of it) and listed on the page. The plugin then loads by the normal path: the
folder watcher when hot reload is on, else the host's rescan of that folder, at once."""

from __future__ import annotations

import logging
from pathlib import Path

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from plugins import host as plugin_host
from plugins.install import Installed, InstallError, install_zip, limits, mib
from plugins.install_git import install_git
from plugins.models import PluginInstall
from plugins.records import PluginState
from plugins.upload_limit import max_body

INSTALL_PLUGIN = "plugins.install_plugin"
RESCAN = "plugins.reload_plugin"

logger = logging.getLogger("plugins.host")


def _known_ids() -> dict[str, Path]:
    current = plugin_host.host
    if current is None:
        return {}
    return {
        pid: r.folder
        for pid, r in current.records.items()
        if r.plugin_id and not pid.startswith("folder:") and r.state != PluginState.REMOVED
    }


def _load(installed: Installed) -> str:
    """Where the new plugin loads: the watcher (hot reload), else the running host at once, else at start."""
    current = plugin_host.host
    if current is None:
        return _("The plugin host has not started in this process: it loads when the bot starts.")
    if current.watcher is not None and current.watcher.hot_reload:
        return _("The folder watcher loads it within seconds: reload this page to see its state.")
    return current.add_folder(installed.folder).message


def _install(request: HttpRequest) -> tuple[PluginInstall, Installed]:
    url = request.POST.get("git_url", "").strip()
    upload = request.FILES.get("archive")
    if bool(url) == bool(upload):
        raise InstallError(_("Give either a zip file or a git URL."))
    row = PluginInstall(user=request.user, source="git" if url else "zip", origin=(url or upload.name)[:500])
    try:
        installed = install_git(url, _known_ids()) if url else install_zip(upload, upload.size, _known_ids())
    except InstallError as exc:
        row.detail = str(exc)[:4000]
        row.save()
        raise
    row.ok, row.plugin_id, row.version = True, installed.plugin_id, installed.version
    row.folder, row.revision = installed.folder.name, installed.revision
    return row, installed


@require_POST
def plugin_install_view(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(INSTALL_PLUGIN):
        raise PermissionDenied
    # Before the body is read: a request over the limit is refused whole (the ASGI server's limit is the
    # same, plugins.upload_limit, and answers before reading it).
    if int(request.META.get("CONTENT_LENGTH") or 0) > max_body():
        messages.error(
            request, _("Refused: the upload is larger than %(limit)s.") % {"limit": mib(limits().upload_bytes)}
        )
        return redirect("console-plugins")
    try:
        row, installed = _install(request)
    except InstallError as exc:
        logger.warning("plugin install by %s refused: %s", request.user.get_username(), exc)
        messages.error(request, str(exc))
        return redirect("console-plugins")
    logger.info(
        "plugin %s %s installed into %s by %s from %s (%s)",
        row.plugin_id, row.version, row.folder, request.user.get_username(), row.origin, row.revision,
    )  # fmt: skip
    row.detail = _load(installed)
    row.save()
    text = _("Installed %(name)s %(version)s (%(id)s) into plugins/%(folder)s/.") % {
        "name": installed.name, "version": installed.version, "id": installed.plugin_id, "folder": row.folder
    }  # fmt: skip
    messages.success(request, f"{text} {row.detail}")
    for warning in installed.warnings:
        messages.warning(request, warning)
    return redirect("console-plugins")


@require_POST
def plugin_rescan_view(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(RESCAN):
        raise PermissionDenied
    current = plugin_host.host
    if current is None:
        messages.error(request, _("The plugin host has not started in this process."))
        return redirect("console-plugins")
    outcomes = current.rescan()
    if not outcomes:
        messages.info(request, _("Rescanned: nothing new and nothing removed."))
    for outcome in outcomes:
        (messages.success if outcome.ok else messages.error)(request, outcome.message)
    return redirect("console-plugins")
