"""Zips of the example plugins (tests/plugins/fixtures) laid out as plugin releases are, and as an
attacker would lay them out, for the console's Install form (plugins.install)."""

from __future__ import annotations

import io
import json
import stat
import warnings
import zipfile
from pathlib import Path

from tests.plugins.conftest import FIXTURES

WEATHER_ID = "test.maibot.weather"
WEATHER_FOLDER = "test_maibot_weather"


def plugin_files(name: str = "weather") -> dict[str, bytes]:
    root = FIXTURES / name
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def make_zip(files: dict[str, bytes], prefix: str = "") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(prefix + name, data)
    return buffer.getvalue()


def with_entry(files: dict[str, bytes], name: str, data: bytes = b"x = 1\n", mode: int | None = None) -> bytes:
    """The plugin's zip with one more entry `name` (its Unix mode bits `mode`: a symlink, a FIFO…)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for existing, content in files.items():
            archive.writestr(existing, content)
        info = zipfile.ZipInfo(name)
        info.compress_type = zipfile.ZIP_DEFLATED
        if mode is not None:
            info.external_attr = mode << 16
            info.create_system = 3  # Unix
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Duplicate name": the point of one attack
            archive.writestr(info, data)
    return buffer.getvalue()


def weather_manifest(**changes) -> bytes:
    data = json.loads((FIXTURES / "weather" / "_manifest.json").read_text())
    data.update(changes)
    return json.dumps(data).encode()


def upload(data: bytes, name: str = "weather.zip"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, data, content_type="application/zip")


SYMLINK = stat.S_IFLNK | 0o777
FIFO = stat.S_IFIFO | 0o644
BLOCK_DEVICE = stat.S_IFBLK | 0o644


def lying_zip(files: dict[str, bytes], name: str, real: bytes, declared: int) -> bytes:
    """A zip whose entry `name` holds `real` but whose central directory declares `declared` bytes."""
    data = bytearray(make_zip({**files, name: real}))
    # The central directory entry of `name`: signature PK\x01\x02, uncompressed size at offset 24.
    at = data.rfind(b"PK\x01\x02", 0, data.rfind(name.encode()))
    data[at + 24 : at + 28] = declared.to_bytes(4, "little")
    return bytes(data)


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.is_dir() else []


def staff(*perms: str):
    """A staff user with these permissions ("app_label.codename") and no other."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(f"staff{User.objects.count()}", password="pw", is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return User.objects.get(pk=user.pk)


def assert_nothing_written(data_dir: Path) -> None:
    assert tree(data_dir / "plugins") == []
    assert tree(data_dir / ".plugin-staging") == []
