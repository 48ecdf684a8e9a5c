"""The data dir's version stamp: which build last migrated it, so an older build refuses to start on it.

Replacing maibot.pyz with a newer build and starting it migrates the data and moves the stamp forward.
Starting an older build on that data would run code against a schema it does not know: it stops with a
message naming both versions instead. Two facts are checked, either one refuses: the stamp file
(`maibot-version.json` in the data dir, written after every successful migrate) and the database itself
(a migration applied there that this build does not have, which also covers a shared PostgreSQL).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from maibot import __version__

STAMP_NAME = "maibot-version.json"


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
