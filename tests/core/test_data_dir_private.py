"""The data dir is the server user's alone (issue #25: it was 0755, db.sqlite3, its -wal/-shm and
bot_config.toml 0644, so any local user could read the session keys): started on a data dir an earlier
version left world-readable, `maibot` (the single file's command: bootstrap, then serve) leaves it 0700
with every file 0600, and what it writes while running (the database's -wal/-shm, the config saved
from the editor, media) is private too."""

from __future__ import annotations

import html
import http.cookiejar
import os
import re
import signal
import sqlite3
import stat
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage

from core import datadir
from tests.conftest import Proc, free_port, wait_for

OLD_CONFIG = """[bot]
nickname = "Old"

[plugins]
auto_install_dependencies = true
pip_args = ["--no-index"]
"""


def _modes(root: Path, *, kept: tuple[str, ...] = ()) -> dict[str, str]:
    """Every folder and file under `root` (itself included) that is not private, with its mode; the
    contents of the folders `kept` (directly in `root`) are not looked at."""
    wrong = {}
    for path in [root, *root.rglob("*")]:
        if any(path.is_relative_to(root / name) and path != root / name for name in kept):
            continue
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            continue
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077 or (stat.S_ISDIR(info.st_mode) and mode != 0o700):
            wrong[str(path.relative_to(root))] = oct(mode)
    return wrong


def _old_data_dir(data: Path) -> None:
    """A data dir as an earlier version (umask 022) left it, with a database in WAL mode."""
    old = os.umask(0o022)
    try:
        data.mkdir(mode=0o755)
        (data / "bot_config.toml").write_text(OLD_CONFIG)
        (data / "secret_key").write_text("an-old-secret-key-" + "x" * 40)
        (data / "deployment.env").write_text("OPENAI_API_KEY=sk-old\n")
        plugin = data / "plugins" / "old_plugin"
        plugin.mkdir(parents=True)
        (plugin / "config.toml").write_text("[plugin]\nenabled = false\n")
        (data / "media").mkdir()
        (data / "media" / "picture.png").write_bytes(b"\x89PNG")
        with sqlite3.connect(data / "db.sqlite3") as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE leftover (x)")
        os.chmod(data / "secret_key", 0o644)
    finally:
        os.umask(old)
    assert _modes(data), "the old data dir should start world-readable"


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def _form_fields(page: str) -> dict[str, str]:
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page))
    textarea = re.search(r'<textarea name="toml"[^>]*>\n?(.*?)</textarea>', page, re.S)
    if textarea:
        fields["toml"] = html.unescape(textarea[1])
    return fields


def _post(opener, url: str, fields: dict[str, str]) -> str:
    data = urllib.parse.urlencode(fields).encode()
    request = urllib.request.Request(url, data=data, headers={"Referer": url})
    with opener.open(request, timeout=30) as response:
        return response.read().decode()


@pytest.mark.live
@pytest.mark.long
@pytest.mark.backend_independent  # it runs the embedded default (SQLite) whichever suite runs it
@pytest.mark.timeout(240)
def test_maibot_started_on_an_old_world_readable_data_dir_leaves_it_private(tmp_path):
    data = tmp_path / "maibot-data"
    _old_data_dir(data)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "DATABASE_URL", "REDIS_URL"))}
    env.pop("SECRET_KEY", None)
    env.update(
        MAIBOT_DATA_DIR=str(data),
        HOST="127.0.0.1",
        PORT=str(port),
        PYTHONUNBUFFERED="1",
        DJANGO_SUPERUSER_USERNAME="op",
        DJANGO_SUPERUSER_PASSWORD="a-long-password-1",
        MAIBOT_Q_NAME=f"private-{os.getpid()}",
    )
    # The operator's shell umask (022), not the test process's: the command must make its files private.
    command = f"umask 022; exec {sys.executable} -m maibot"
    proc = Proc(["sh", "-c", command], env, tmp_path / "maibot.log")
    base = f"http://127.0.0.1:{port}"
    try:
        proc.wait_for_output("maibot is starting", timeout=120)
        opener = _opener()

        def login_page() -> str | None:
            try:
                with opener.open(f"{base}/admin/login/", timeout=5) as response:
                    return response.read().decode()
            except OSError:
                return None

        assert wait_for(login_page, timeout=60), proc.output()
        fields = _form_fields(login_page())
        credentials = {"username": "op", "password": "a-long-password-1"}
        _post(opener, f"{base}/admin/login/?next=/admin/", {**fields, **credentials})
        with opener.open(f"{base}/admin/config/raw/", timeout=30) as response:
            raw = _form_fields(response.read().decode())
        assert 'nickname = "Old"' in raw["toml"], raw  # the old file loads (its retired keys ignored)
        saved = _post(opener, f"{base}/admin/config/raw/", {**raw, "toml": raw["toml"].replace('"Old"', '"New"')})
        assert "Saved and applied" in saved, saved[-2000:]
        assert 'nickname = "New"' in (data / "bot_config.toml").read_text()
        # The cluster's services have started too (its heartbeat is in the database).
        assert wait_for(lambda: "cluster process" in proc.output(), timeout=60), proc.output()
        assert (data / "db.sqlite3-wal").exists() and (data / "db.sqlite3-shm").exists()
        assert _modes(data, kept=datadir.CONTENTS_KEPT) == {}
    finally:
        proc.terminate(signal.SIGTERM)
        assert proc.stop(timeout=60) == 0, proc.output()
    assert _modes(data, kept=datadir.CONTENTS_KEPT) == {}
    # The plugins' code keeps its modes: a sandboxed runner reads it as a uid of its own.
    assert stat.S_IMODE((data / "plugins" / "old_plugin" / "config.toml").stat().st_mode) == 0o644


def test_make_private_fixes_folders_and_files_and_keeps_an_owners_execute_bit(tmp_path):
    old = os.umask(0o022)
    try:
        (tmp_path / "a" / "b").mkdir(parents=True)
        (tmp_path / "a" / "b" / "f").write_text("x")
        (tmp_path / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(tmp_path / "run.sh", 0o755)
        outside = tmp_path.parent / f"{tmp_path.name}-outside"
        outside.write_text("not ours to change")
        os.chmod(outside, 0o644)
        (tmp_path / "link").symlink_to(outside)
    finally:
        os.umask(old)
    shallow = datadir.make_private(tmp_path, deep=False)
    assert tmp_path / "a" / "b" not in shallow and (tmp_path / "a") in shallow
    datadir.make_private(tmp_path)
    assert _modes(tmp_path) == {}
    assert stat.S_IMODE((tmp_path / "run.sh").stat().st_mode) == 0o700
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644  # a link is not followed


def test_saved_media_are_private_whatever_the_umask(settings, tmp_path):
    """Django's storage chmods each file it saves (0o644 unless FILE_UPLOAD_PERMISSIONS says otherwise)."""
    old = os.umask(0o022)
    try:
        storage = FileSystemStorage(location=tmp_path / "media")
        name = storage.save("chat/2026/picture.png", ContentFile(b"\x89PNG"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "media" / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "media" / "chat").stat().st_mode) == 0o700


def test_a_config_saved_over_an_old_world_readable_file_is_private(settings, tmp_path, db):
    from core import config, reload

    settings.DATA_DIR = tmp_path
    path = tmp_path / "bot_config.toml"
    path.write_text('[bot]\nnickname = "Old"\n')
    os.chmod(path, 0o644)
    old = os.umask(0o022)
    try:
        reload.config_save_text(text='[bot]\nnickname = "New"\n', path=path)
        fresh = tmp_path / "fresh" / "bot_config.toml"
        config.ensure_config_file(fresh)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and config.get_config().bot.nickname == "New"
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
