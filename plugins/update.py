"""Updating an installed plugin from the console: the same zip or git URL an install takes (plugins.install,
plugins.install_git, every check of theirs first), for a plugin the operator names, replacing its folder.

The named plugin is found by its id (a manifest id, never a path): the running host's folder for it, else
the folder of `plugins/` whose manifest has that id; a folder outside `plugins/` or a symlink is refused.
The new version is unpacked and checked in its staging folder exactly as an install is; its manifest must
have the same id. The operator's `config.toml` of the old folder (a plain file) then replaces the new
tree's, whatever the new archive ships (the new version's default is not used; options it adds take their
defaults when the plugin loads). Then two renames on one file system, under the install lock: the old
folder aside, the new tree into its place (the same folder name). If the second rename
fails, the old folder is renamed back; the plugins folder never holds half a plugin. The old folder waits
in the data dir (never inside a staging folder, which is removed whatever happens), so that should even
the rename back fail it stays whole where the error says. It is removed after the swap, and with it
anything else the plugin wrote into its own folder: only config.toml is kept."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.utils.translation import gettext as _
from packaging.version import InvalidVersion, Version

from plugins import install
from plugins import manifest as mf
from plugins.host_base import CONFIG_FILE, plugins_dir
from plugins.install import Installed, InstallError, checked_manifest
from plugins.loading import raw_id


@dataclass(frozen=True)
class Target:
    """The installed plugin an update replaces: its id, its folder in plugins/ and its version there."""

    plugin_id: str
    folder: Path
    version: str


def _old_version(folder: Path) -> str:
    try:
        return mf.read_manifest(folder).version
    except (mf.ManifestError, OSError):
        return ""


def find_target(plugin_id: str, known_ids: dict[str, Path] | None = None) -> Target:
    """The installed plugin `plugin_id` names; InstallError when it is no plugin id or none is installed."""
    plugin_id = plugin_id.strip()
    missing = InstallError(
        _("Refused: there is no installed plugin %(id)s to update (install it instead).") % {"id": plugin_id[:200]}
    )
    if not mf.is_plugin_id(plugin_id):
        raise missing
    directory = plugins_dir().resolve()
    folder = (known_ids or {}).get(plugin_id)
    if folder is None and directory.is_dir():
        folder = next((p for p in sorted(directory.iterdir()) if p.is_dir() and raw_id(p) == plugin_id), None)
    if folder is None or folder.is_symlink() or not folder.is_dir() or folder.resolve().parent != directory:
        raise missing
    folder = directory / folder.name
    if raw_id(folder) != plugin_id:
        raise missing
    return Target(plugin_id, folder, _old_version(folder))


def installed_plugins() -> list[Target]:
    """The plugins of plugins/ an update can name (the Update form's choices), by id."""
    directory = plugins_dir()
    if not directory.is_dir():
        return []
    found = {}
    for folder in sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink()):
        plugin_id = raw_id(folder)
        if plugin_id and mf.is_plugin_id(plugin_id) and plugin_id not in found:
            found[plugin_id] = Target(plugin_id, folder, _old_version(folder))
    return sorted(found.values(), key=lambda t: t.plugin_id)


def _compare(old: str, new: str) -> int:
    try:
        a, b = Version(old), Version(new)
    except InvalidVersion:
        return 0 if old == new else 1
    return (a > b) - (a < b)


def version_notes(target: Target, new_version: str) -> tuple[list[str], list[str]]:
    """What the outcome says of the versions: (notes, warnings)."""
    names = {"old": target.version or "?", "new": new_version}
    order = _compare(target.version, new_version)
    if target.version and order == 0:
        return [_("The same version %(new)s was installed again.") % names], []
    if target.version and order > 0:
        return [], [_("This is a downgrade: %(old)s → %(new)s.") % names]
    return [], []


def keep_config(old_folder: Path, root: Path) -> str:
    """Put the old folder's config.toml into the new tree; what the outcome says of it ("": no config)."""
    old, new = old_folder / CONFIG_FILE, root / CONFIG_FILE
    if old.is_symlink() or not old.is_file():
        return ""
    data = old.read_bytes()
    if new.is_symlink() or (new.exists() and not new.is_file()):
        raise InstallError(_("Refused: the new version's config.toml is not a plain file."))
    shipped = new.read_bytes() if new.exists() else None
    if shipped == data:
        return _("Your config.toml is kept (the new version ships the same one).")
    new.unlink(missing_ok=True)
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    if shipped is None:
        return _("Your config.toml is kept.")
    return _("Your config.toml is kept; the new version's default config.toml was not used.")


class NotPutBack(OSError):
    """The new tree could not be renamed in, nor the old folder back: the old one is whole at `kept`."""

    def __init__(self, error: OSError, kept: Path) -> None:
        super().__init__(str(error))
        self.kept = kept


def swap(root: Path, folder: Path) -> Path:
    """Rename `folder` aside (into the data dir, outside every staging folder) and `root` into its place;
    the old folder's new path, for the caller to remove. On failure the old folder is renamed back and
    OSError raised; should even that fail, NotPutBack names where the old folder is (nothing removes it)."""
    aside = Path(settings.DATA_DIR) / f".{folder.name}.replaced-{time.time_ns()}"
    os.rename(folder, aside)
    try:
        os.rename(root, folder)
    except OSError as exc:
        try:
            os.rename(aside, folder)
        except OSError:
            raise NotPutBack(exc, aside) from None
        raise
    return aside


def swap_in(root: Path, target: Target) -> Installed:
    """Check the staged plugin at `root` and swap it in for `target`'s folder (plugins.install.move_in's
    counterpart for an update). Refused: nothing in plugins/ changed."""
    manifest, warnings = checked_manifest(root)
    if manifest.id != target.plugin_id:
        raise InstallError(
            _("Refused: the archive holds the plugin %(new)s, not %(old)s: nothing was replaced.")
            % {"new": manifest.id, "old": target.plugin_id}
        )
    notes, downgrade = version_notes(target, manifest.version)
    with install.move_lock:
        if raw_id(target.folder) != target.plugin_id or target.folder.is_symlink():
            raise InstallError(_("Refused: the plugin's folder changed meanwhile: nothing was replaced."))
        if kept := keep_config(target.folder, root):
            notes.append(kept)
        os.chmod(root, 0o755)
        try:
            replaced = swap(root, target.folder)
        except NotPutBack as exc:
            raise InstallError(
                _(
                    "The update failed and the installed version could not be put back: it is kept whole in "
                    "%(kept)s; move it back into plugins/ as %(folder)s. (%(error)s)"
                )
                % {"kept": exc.kept, "folder": target.folder.name, "error": exc}
            ) from None
        except OSError as exc:
            raise InstallError(
                _("The update failed, the installed version was put back: %(error)s") % {"error": exc}
            ) from None
    shutil.rmtree(replaced, ignore_errors=True)
    return Installed(
        manifest.id, manifest.version, manifest.name, target.folder, warnings=downgrade + warnings, notes=notes
    )
