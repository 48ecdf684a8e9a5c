"""The Plugins page's Install and Update forms (a zip upload or a git URL, permission
plugins.install_plugin: an update runs new code as an install does) and its Rescan button
(plugins.reload_plugin). Every attempt is recorded (plugins.models.PluginInstall: who, when, from where,
what came of it; an update with the version it replaced) and listed on the page. The plugin then loads
by the normal path: the folder watcher when hot reload is on, else the host's rescan of that folder (an
update: the host's reload of the plugin), at once."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from plugins import host as plugin_host
from plugins.install import Installed, InstallError, install_zip, limits, mib, move_in
from plugins.install_git import install_git
from plugins.models import PluginInstall
from plugins.records import PluginState
from plugins.update import find_target, swap_in
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


def _load(installed: Installed, update: bool = False) -> str:
    """Where the new plugin loads: the watcher (hot reload), else the running host at once, else at start.
    An update of a plugin the watcher would not reload (its allow_hot_reload off) is reloaded at once."""
    current = plugin_host.host
    if current is None:
        return _("The plugin host has not started in this process: it loads when the bot starts.")
    record = current.records.get(installed.plugin_id) if update else None
    hot = current.watcher is not None and current.watcher.hot_reload
    if hot and (record is None or record.allow_hot_reload or record.state == PluginState.REMOVED):
        if update:
            return _("The folder watcher reloads it within seconds: reload this page to see its state.")
        return _("The folder watcher loads it within seconds: reload this page to see its state.")
    if record is not None and record.state != PluginState.REMOVED:
        return _("Reloaded: %(outcome)s") % {
            "outcome": current.reload(installed.plugin_id, source="update from the console").message
        }
    return current.add_folder(installed.folder).message


def _install(request: HttpRequest, update: bool = False) -> tuple[PluginInstall, Installed]:
    url = request.POST.get("git_url", "").strip()
    upload = request.FILES.get("archive")
    if bool(url) == bool(upload):
        raise InstallError(_("Give either a zip file or a git URL."))
    row = PluginInstall(
        user=request.user, source="git" if url else "zip", origin=(url or upload.name)[:500], update=update
    )
    known = _known_ids()
    place = partial(move_in, known_ids=known)
    try:
        if update:
            row.plugin_id = request.POST.get("plugin_id", "")[:200]
            target = find_target(row.plugin_id, known)
            row.previous_version, row.folder = target.version[:40], target.folder.name
            place = partial(swap_in, target=target)
        installed = install_git(url, place) if url else install_zip(upload, upload.size, place)
    except InstallError as exc:
        row.detail = str(exc)[:4000]
        row.save()
        raise
    row.ok, row.plugin_id, row.version = True, installed.plugin_id, installed.version
    row.folder, row.revision = installed.folder.name, installed.revision
    return row, installed


def _refused_unread(request: HttpRequest) -> bool:
    """Before the body is read: a request over the limit is refused whole (the ASGI server's limit is the
    same, plugins.upload_limit, and answers before reading it)."""
    if int(request.META.get("CONTENT_LENGTH") or 0) <= max_body():
        return False
    messages.error(request, _("Refused: the upload is larger than %(limit)s.") % {"limit": mib(limits().upload_bytes)})
    return True


def _attempt(request: HttpRequest, update: bool) -> tuple[PluginInstall, Installed] | None:
    if not request.user.has_perm(INSTALL_PLUGIN):
        raise PermissionDenied
    if _refused_unread(request):
        return None
    try:
        return _install(request, update)
    except InstallError as exc:
        what = "update" if update else "install"
        logger.warning("plugin %s by %s refused: %s", what, request.user.get_username(), exc)
        messages.error(request, str(exc))
        return None


def _done(request: HttpRequest, row: PluginInstall, installed: Installed, text: str) -> HttpResponse:
    """Record the attempt that succeeded and say so (and the manifest's warnings)."""
    row.save()
    messages.success(request, f"{text} {row.detail}")
    for warning in installed.warnings:
        messages.warning(request, warning)
    return redirect("console-plugins")


@require_POST
def plugin_install_view(request: HttpRequest) -> HttpResponse:
    if (done := _attempt(request, update=False)) is None:
        return redirect("console-plugins")
    row, installed = done
    logger.info(
        "plugin %s %s installed into %s by %s from %s (%s)",
        row.plugin_id, row.version, row.folder, request.user.get_username(), row.origin, row.revision,
    )  # fmt: skip
    row.detail = _load(installed)
    text = _("Installed %(name)s %(version)s (%(id)s) into plugins/%(folder)s/.") % {
        "name": installed.name, "version": installed.version, "id": installed.plugin_id, "folder": row.folder
    }  # fmt: skip
    return _done(request, row, installed, text)


@require_POST
def plugin_update_view(request: HttpRequest) -> HttpResponse:
    """Replace an installed plugin (the form's `plugin_id`) by the new version in the zip or git URL."""
    if (done := _attempt(request, update=True)) is None:
        return redirect("console-plugins")
    row, installed = done
    logger.info(
        "plugin %s updated %s → %s in %s by %s from %s (%s)", row.plugin_id, row.previous_version or "?",
        row.version, row.folder, request.user.get_username(), row.origin, row.revision,
    )  # fmt: skip
    row.detail = " ".join([*installed.notes, _load(installed, update=True)])
    text = _("Updated %(name)s (%(id)s) from %(old)s to %(new)s in plugins/%(folder)s/.") % {
        "name": installed.name, "id": installed.plugin_id, "old": row.previous_version or "?",
        "new": installed.version, "folder": row.folder,
    }  # fmt: skip
    return _done(request, row, installed, text)


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
