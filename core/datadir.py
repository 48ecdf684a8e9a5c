"""The data dir: its version stamp, and its privacy.

Privacy: the data dir holds the database (session keys), bot_config.toml, deployment.env, secret_key and
the plugins' files, so it is the server user's alone: the folder and every folder in it 0700, every
file 0600 (an owner's execute bit is kept). Every process writes what it creates there private, and
maibot.settings makes the folder itself and the files directly in it private at import; a data dir made by
an earlier version, or copied in, is put right in full by `make_private` at bootstrap and when the
server and the cluster start their services. Symbolic links are never followed. The one exception: the
contents of `plugins/` keep their modes (CONTENTS_KEPT), since a sandboxed runner reads its plugin's code
as a uid of its own; the `plugins/` folder itself is private.

The version stamp: which build last migrated it, so an older build refuses to start on it.

Replacing maibot.pyz with a newer build and starting it migrates the data and moves the stamp forward.
Starting an older build on that data would run code against a schema it does not know: it stops with a
message naming both versions instead. Two facts are checked, either one refuses: the stamp file
(`maibot-version.json` in the data dir, written after every successful migrate) and the database itself
(a migration applied there that this build does not have, which also covers a shared PostgreSQL).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from core import __version__

STAMP_NAME = "maibot-version.json"
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Folders directly in the data dir that are made private themselves but whose contents keep their modes:
# the plugins' code, which a sandboxed runner reads as a uid of its own (plugins.sandbox). No server
# secret is in there, and no other local user reaches it through the private data dir.
CONTENTS_KEPT = ("plugins",)

logger = logging.getLogger(__name__)


class DataDirTooNew(Exception):
    """The data dir was written by a newer build than this one."""


def parse_version(text: str) -> tuple[int, ...]:
    """ "1.2.10" → (1, 2, 10). Anything else is not a version this build can have written."""
    parts = text.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(p) for p in parts)


def stamp_path() -> Path:
    return Path(settings.DATA_DIR) / STAMP_NAME


def read_stamp() -> dict | None:
    """The stamp, or None for a data dir no build has stamped yet (new, or from before stamps)."""
    try:
        return json.loads(stamp_path().read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def unknown_applied_migrations() -> list[str]:
    """Migrations recorded as applied in the database that this build does not contain."""
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection, ignore_no_migrations=True)
    applied = loader.applied_migrations
    return sorted(f"{app}.{name}" for app, name in applied if (app, name) not in loader.disk_migrations)


def check_not_newer() -> None:
    """Raise DataDirTooNew when the data dir (stamp or database) is ahead of this build."""
    ours = parse_version(__version__)
    stamp = read_stamp()
    if stamp is not None:
        written = str(stamp.get("version", ""))
        try:
            newer = parse_version(written) > ours
        except ValueError:
            raise DataDirTooNew(
                f"{stamp_path()} names version {written!r}, which this build ({__version__}) cannot read"
            ) from None
        if newer:
            raise DataDirTooNew(
                f"the data dir {settings.DATA_DIR} was last used by maibot {written}; this is {__version__}. "
                "Start the newer build (or restore a backup made for this one)."
            )
    unknown = unknown_applied_migrations()
    if unknown:
        shown = ", ".join(unknown[:5]) + (" …" if len(unknown) > 5 else "")
        raise DataDirTooNew(
            f"the database has migrations this build ({__version__}) does not know: {shown}. "
            "It was migrated by a newer maibot; start that build."
        )


def write_stamp() -> None:
    """Record this build as the one that last migrated the data dir (atomically: never half a file)."""
    path = stamp_path()
    payload = {"version": __version__, "migrated_at": datetime.now(UTC).isoformat(timespec="seconds")}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".stamp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def create_private(path: str | Path) -> None:
    """Create `path` as an empty 0600 file unless it exists (a database file, before SQLite creates it
    with the process's umask: its -wal and -shm files then take the same mode)."""
    path = str(path)
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE))
    except FileExistsError:
        pass
    except FileNotFoundError:
        pass  # its folder does not exist: SQLite will say so when it connects


def make_private(root: Path, *, deep: bool = True) -> list[Path]:
    """Make `root` and what is in it private (see the module docstring): the folders and files found
    otherwise, and what was changed, are returned. `deep=False`: only `root` and the entries directly in
    it (cheap enough for every process start). One that cannot be changed (another owner) is reported on
    stderr and the rest goes on."""
    changed: list[Path] = []

    def fix(path: Path, info: os.stat_result) -> None:
        if stat.S_ISLNK(info.st_mode):
            return
        mode = stat.S_IMODE(info.st_mode)
        wanted = PRIVATE_DIR_MODE if stat.S_ISDIR(info.st_mode) else (mode & 0o100) | PRIVATE_FILE_MODE
        if mode != wanted:
            try:
                os.chmod(path, wanted, follow_symlinks=False)
            except OSError as exc:
                print(f"maibot: cannot make {path} private (mode {mode:o}): {exc}", file=sys.stderr)
                return
            changed.append(path)

    def walk(folder: Path) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return  # vanished, or not ours to read: the folder's own mode was reported above
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile (a -wal file at checkpoint)
            fix(Path(entry.path), info)
            if deep and entry.is_dir(follow_symlinks=False) and not (folder == root and entry.name in CONTENTS_KEPT):
                walk(Path(entry.path))

    root = Path(root)
    fix(root, root.lstat())
    walk(root)
    if changed:
        logger.info("data dir %s made private: %d folders and files were readable by others", root, len(changed))
    return changed
