"""Installing a plugin from the console: a zip upload (plugins.install) or a git URL (plugins.install_git).

Nothing reaches the plugins folder before it is known to be a plugin this host accepts. The archive is
checked whole before one byte is unpacked: at most `MAIBOT_PLUGIN_INSTALL_MAX_ENTRIES` entries and
`MAIBOT_PLUGIN_INSTALL_MAX_UNPACKED` bytes declared (a zip bomb is refused by its directory alone), every
name a relative path inside the plugin's folder (no `..`, no absolute path, no backslash), every entry a
plain file or folder (no symlink, no special file), none encrypted or named twice. It is then unpacked
into a private staging folder of the data dir (`.plugin-staging/`, on the plugins folder's file system),
its manifest read and checked by plugins.manifest (id, versions, host and SDK ranges), and only then
moved into `plugins/<folder>` with one rename: the watcher sees a whole plugin or none. A plugin whose id
or folder is already there is refused (never overwritten): replacing one is an update (plugins.update).
The folder is named after the plugin's id (dots made underscores: `github.author.weather` →
`github_author_weather`)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from django.conf import settings
from django.utils.translation import gettext as _

from plugins import manifest as mf
from plugins.host_base import plugins_dir
from plugins.loading import raw_id

STAGING = ".plugin-staging"
# Folders in a release zip that are never part of the plugin (macOS's resource forks).
SKIPPED_PREFIXES = ("__MACOSX/",)
CHUNK = 64 * 1024
_FOLDER_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# One install moves into plugins/ at a time: the check that the folder and id are free holds until the rename.
move_lock = threading.Lock()


class InstallError(Exception):
    """Why a plugin was not installed (shown to the operator, in the operator's language)."""


@dataclass(frozen=True)
class Limits:
    upload_bytes: int
    unpacked_bytes: int
    entries: int
    git_timeout: float


def limits() -> Limits:
    return Limits(
        upload_bytes=settings.MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD,
        unpacked_bytes=settings.MAIBOT_PLUGIN_INSTALL_MAX_UNPACKED,
        entries=settings.MAIBOT_PLUGIN_INSTALL_MAX_ENTRIES,
        git_timeout=settings.MAIBOT_PLUGIN_INSTALL_GIT_TIMEOUT,
    )


def mib(size: int) -> str:
    """A size as the operator reads it: 20 MiB, 100 KiB."""
    return f"{size / (1024 * 1024):g} MiB" if size >= 1024 * 1024 else f"{size / 1024:g} KiB"


@dataclass
class Installed:
    """A plugin moved into the plugins folder."""

    plugin_id: str
    version: str
    name: str
    folder: Path
    revision: str = ""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said in the outcome (an update: its config.toml kept)


def clear_stale_staging(*, now: float | None = None) -> list[str]:
    """Remove the staging folders installs left behind when their process died mid-way (an install
    removes its own, whatever its outcome): those untouched for an hour, or twice the git time-out if that
    is longer, so that an install still running in another process sharing the data dir keeps its folder.
    The names removed (the plugin host counts them in its log as it starts)."""
    root = Path(settings.DATA_DIR) / STAGING
    if not root.is_dir():
        return []
    cutoff = (time.time() if now is None else now) - max(3600.0, 2 * limits().git_timeout)
    removed = []
    for stage in sorted(root.iterdir()):
        if stage.is_dir() and not stage.is_symlink() and stage.stat().st_mtime < cutoff:
            shutil.rmtree(stage, ignore_errors=True)
            removed.append(stage.name)
    return removed


@contextmanager
def staging() -> Iterator[Path]:
    """A fresh private folder in the data dir's staging area, removed with what is left in it."""
    root = Path(settings.DATA_DIR) / STAGING
    root.mkdir(mode=0o700, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=root))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


# --- a zip's entries ---------------------------------------------------------------------------------


def entry_parts(name: str) -> tuple[str, ...]:
    """The path parts of a zip entry's name; InstallError when it could lead outside the plugin's folder."""
    if "\x00" in name or "\\" in name:
        raise InstallError(_("Refused: the entry %(name)s has a backslash or a NUL in its name.") % {"name": name})
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise InstallError(_("Refused: the entry %(name)s is an absolute path.") % {"name": name})
    parts = tuple(PurePosixPath(name).parts)
    if not parts or any(p in ("..", ".") for p in name.rstrip("/").split("/")):
        raise InstallError(_("Refused: the entry %(name)s leads outside the plugin's folder.") % {"name": name})
    if "" in name.rstrip("/").split("/"):
        raise InstallError(_("Refused: the entry %(name)s has an empty path part.") % {"name": name})
    return parts


def _check_entry(info: zipfile.ZipInfo) -> None:
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        raise InstallError(_("Refused: the entry %(name)s is a symbolic link.") % {"name": info.filename})
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise InstallError(
            _("Refused: the entry %(name)s is not a plain file or folder (a link or a device).")
            % {"name": info.filename}
        )
    if info.flag_bits & 0x1:
        raise InstallError(_("Refused: the entry %(name)s is encrypted.") % {"name": info.filename})


def check_zip(archive: zipfile.ZipFile, lim: Limits) -> tuple[list[zipfile.ZipInfo], tuple[str, ...]]:
    """The entries to unpack and the prefix (none, or one top-level folder) that holds _manifest.json;
    InstallError when any entry or the whole is refused. Reads only the archive's directory."""
    infos = [i for i in archive.infolist() if not i.filename.startswith(SKIPPED_PREFIXES)]
    if len(infos) > lim.entries:
        raise InstallError(
            _("Refused: the archive has %(count)d entries; at most %(limit)d are allowed.")
            % {"count": len(infos), "limit": lim.entries}
        )
    total = sum(i.file_size for i in infos)
    if total > lim.unpacked_bytes:
        raise InstallError(
            _("Refused: the archive unpacks to %(size)s; at most %(limit)s is allowed.")
            % {"size": mib(total), "limit": mib(lim.unpacked_bytes)}
        )
    seen: set[tuple[str, ...]] = set()
    for info in infos:
        parts = entry_parts(info.filename)
        _check_entry(info)
        if parts in seen:
            raise InstallError(_("Refused: the entry %(name)s appears twice.") % {"name": info.filename})
        seen.add(parts)
    return infos, _manifest_prefix(seen)


def _manifest_prefix(paths: set[tuple[str, ...]]) -> tuple[str, ...]:
    if (mf.MANIFEST_FILE,) in paths:
        return ()
    tops = sorted({p[0] for p in paths})
    if len(tops) == 1 and (tops[0], mf.MANIFEST_FILE) in paths:
        return (tops[0],)
    raise InstallError(
        _("Refused: no %(manifest)s at the archive's root or in its one top-level folder.")
        % {"manifest": mf.MANIFEST_FILE}
    )


def _unpack(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, budget: list[int]) -> None:
    """One checked entry, written as a new file (never through a link) counting the bytes unpacked."""
    if info.is_dir():
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
        return
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out, archive.open(info) as src:
        while chunk := src.read(CHUNK):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise InstallError(_("Refused: the archive unpacks to more than it declares."))
            out.write(chunk)


def unpack_zip(upload: IO[bytes], stage: Path, lim: Limits) -> Path:
    """Check the zip `upload` whole, then unpack the plugin in it into `stage`; its folder there."""
    try:
        with zipfile.ZipFile(upload) as archive:
            infos, prefix = check_zip(archive, lim)
            root = stage / "plugin"
            root.mkdir(mode=0o755)
            budget = [lim.unpacked_bytes]
            for info in infos:
                parts = entry_parts(info.filename)
                if parts[: len(prefix)] != prefix or len(parts) == len(prefix):
                    continue
                _unpack(archive, info, root.joinpath(*parts[len(prefix) :]), budget)
    except zipfile.BadZipFile as exc:
        raise InstallError(_("Refused: this is not a valid zip archive (%(error)s).") % {"error": exc}) from None
    except (OSError, EOFError, NotImplementedError, RuntimeError) as exc:
        raise InstallError(_("Refused: the archive cannot be unpacked (%(error)s).") % {"error": exc}) from None
    return root


def sha256_of(upload: IO[bytes]) -> str:
    digest = hashlib.sha256()
    upload.seek(0)
    while chunk := upload.read(CHUNK):
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


# --- checking the plugin and moving it in ----------------------------------------------------------


def folder_name(plugin_id: str) -> str:
    return _FOLDER_CHARS.sub("_", plugin_id).lstrip("_-") or "plugin"


def check_tree(root: Path, lim: Limits) -> None:
    """A tree on disk (a git checkout) under the zip's limits: plain files and folders only."""
    count, total = 0, 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            count += 1
            if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                what = path.relative_to(root)
                raise InstallError(_("Refused: %(name)s is not a plain file or folder.") % {"name": what})
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    if count > lim.entries:
        raise InstallError(
            _("Refused: the plugin has %(count)d files and folders; at most %(limit)d are allowed.")
            % {"count": count, "limit": lim.entries}
        )
    if total > lim.unpacked_bytes:
        raise InstallError(
            _("Refused: the plugin is %(size)s; at most %(limit)s is allowed.")
            % {"size": mib(total), "limit": mib(lim.unpacked_bytes)}
        )


def checked_manifest(root: Path) -> tuple[mf.Manifest, list[str]]:
    """The staged plugin's manifest, checked as the host checks it before loading."""
    try:
        manifest = mf.read_manifest(root)
        warnings = mf.check_compatibility(manifest)
    except mf.ManifestError as exc:
        raise InstallError(_("Refused: the plugin's manifest is not accepted: %(reason)s") % {"reason": exc}) from None
    return manifest, warnings


def _taken(manifest: mf.Manifest, target: Path, known_ids: dict[str, Path]) -> str:
    if os.path.lexists(target):
        return _("the folder %(folder)s/ exists already in the plugins folder") % {"folder": target.name}
    where = known_ids.get(manifest.id)
    for folder in sorted(p for p in target.parent.iterdir() if p.is_dir()):
        if where is None and raw_id(folder) == manifest.id:
            where = folder
    if where is not None:
        return _("the plugin %(id)s is installed already (in %(folder)s/)") % {"id": manifest.id, "folder": where.name}
    return ""


def move_in(root: Path, known_ids: dict[str, Path] | None = None) -> Installed:
    """Check the staged plugin at `root` and rename it into the plugins folder (one atomic step). Refused,
    nothing is written there. `known_ids`: the plugins the running host has, id → folder."""
    manifest, warnings = checked_manifest(root)
    directory = plugins_dir()
    directory.mkdir(exist_ok=True)
    target = directory / folder_name(manifest.id)
    with move_lock:
        if why := _taken(manifest, target, known_ids or {}):
            raise InstallError(
                _("Refused: %(why)s. Nothing was overwritten: remove it first to install this one.") % {"why": why}
            )
        os.chmod(root, 0o755)
        os.rename(root, target)
    return Installed(manifest.id, manifest.version, manifest.name, target, warnings=warnings)


# What puts a checked, staged plugin tree in place: move_in (an install), plugins.update.swap_in (an update).
Place = Callable[[Path], Installed]


def install_zip(upload: IO[bytes], size: int, place: Place = move_in) -> Installed:
    """Install the plugin of the uploaded zip (`size` bytes); `place` puts the checked tree in."""
    lim = limits()
    if size > lim.upload_bytes:
        raise InstallError(
            _("Refused: the upload is %(size)s; at most %(limit)s is allowed.")
            % {"size": mib(size), "limit": mib(lim.upload_bytes)}
        )
    digest = sha256_of(upload)
    with staging() as stage:
        installed = place(unpack_zip(upload, stage, lim))
    installed.revision = f"sha256:{digest}"
    return installed
