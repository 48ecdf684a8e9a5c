"""The console's Update form (plugins.update, plugins.install_views.plugin_update_view) with Django's test
client, as an operator uses it and as an attacker would: a new version of an installed plugin replaces its
folder (the operator's config.toml kept) and is recorded; an archive of another plugin, a swap that fails
half-way, a target that is a path, a user without the install permission and a post without CSRF token
leave the installed folder byte for byte as it was."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from django.test import Client

from plugins.models import PluginInstall
from tests.plugins.conftest import host_on
from tests.plugins.git_server import GitServer, bare_repo
from tests.plugins.install_helpers import (
    WEATHER_FOLDER,
    WEATHER_ID,
    make_zip,
    plugin_files,
    staff,
    tree,
    upload,
    weather_manifest,
)

pytestmark = [pytest.mark.django_db, pytest.mark.backend_independent]

INSTALL, UPDATE = "/admin/plugins/install/", "/admin/plugins/update/"
FILES = plugin_files()
OPERATOR_CONFIG = b"""# the operator's settings
[plugin]
config_version = "1.0.0"
enabled = true

[hello]
greeting = "Tashi delek"
"""
NEW_PLUGIN = FILES["plugin.py"] + b"\n# version 1.3.0\n"


def new_version(version: str = "1.3.0", **changes) -> dict[str, bytes]:
    return {**FILES, "plugin.py": NEW_PLUGIN, "extra.py": b"X = 1\n", "_manifest.json": weather_manifest(
        version=version, **changes
    )}  # fmt: skip


def said(response) -> str:
    assert response.status_code == 200
    return " ".join(str(m) for m in response.context["messages"])


def update(client: Client, data: bytes, plugin_id: str = WEATHER_ID, **extra) -> str:
    return said(client.post(UPDATE, {"plugin_id": plugin_id, "archive": upload(data), **extra}, follow=True))


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.fixture
def installed(installer, data_dir) -> Path:
    """The weather plugin 1.2.0 installed from the console, its config.toml edited by the operator, and a
    file of the old version only."""
    said(installer.post(INSTALL, {"archive": upload(make_zip(FILES))}, follow=True))
    folder = data_dir / "plugins" / WEATHER_FOLDER
    (folder / "config.toml").write_bytes(OPERATOR_CONFIG)
    (folder / "old_only.py").write_text("# gone with the old version\n")
    return folder


def test_an_update_replaces_the_folder_keeps_the_config_and_is_recorded(installer, data_dir, installed):
    response = installer.post(
        UPDATE, {"plugin_id": WEATHER_ID, "archive": upload(make_zip(new_version()))}, follow=True
    )
    text = said(response)
    assert f"Updated Weather (test plugin) ({WEATHER_ID}) from 1.2.0 to 1.3.0 in plugins/{WEATHER_FOLDER}/." in text
    assert "Your config.toml is kept; the new version's default config.toml was not used." in text
    assert "loads when the bot starts" in text  # no host in this process
    assert sorted(tree(installed)) == sorted(new_version())
    assert (installed / "plugin.py").read_bytes() == NEW_PLUGIN
    assert (installed / "config.toml").read_bytes() == OPERATOR_CONFIG
    assert tree(data_dir / ".plugin-staging") == [] and tree(data_dir / "plugins") == [
        WEATHER_FOLDER, *(f"{WEATHER_FOLDER}/{n}" for n in sorted(new_version()))
    ]  # fmt: skip
    row = PluginInstall.objects.order_by("-at", "-pk").first()
    assert (row.ok, row.update, row.plugin_id, row.previous_version, row.version, row.folder) == (
        True, True, WEATHER_ID, "1.2.0", "1.3.0", WEATHER_FOLDER,
    )  # fmt: skip
    assert row.revision.startswith("sha256:") and "config.toml is kept" in row.detail
    installs = response.content.decode().split('id="plugin-installs"')[1]
    assert "1.2.0 → 1.3.0" in installs and ">updated</span>" in installs


def test_the_same_version_is_said_and_a_downgrade_is_warned(installer, installed):
    text = update(installer, make_zip(new_version("1.2.0")))
    assert "from 1.2.0 to 1.2.0" in text and "The same version 1.2.0 was installed again." in text
    text = update(installer, make_zip(new_version("1.1.0")))
    assert "from 1.2.0 to 1.1.0" in text and "This is a downgrade: 1.2.0 → 1.1.0." in text
    assert (installed / "config.toml").read_bytes() == OPERATOR_CONFIG


def test_a_new_version_without_a_config_gets_the_operators(installer, installed):
    files = {k: v for k, v in new_version().items() if k != "config.toml"}
    assert "Your config.toml is kept." in update(installer, make_zip(files))
    assert (installed / "config.toml").read_bytes() == OPERATOR_CONFIG


def test_an_archive_of_another_plugin_replaces_nothing(installer, data_dir, installed):
    before = snapshot(installed)
    text = update(installer, make_zip(new_version(id="test.maibot.other")))
    assert f"the archive holds the plugin test.maibot.other, not {WEATHER_ID}: nothing was replaced" in text
    assert snapshot(installed) == before and tree(data_dir / ".plugin-staging") == []
    assert sorted(p.name for p in (data_dir / "plugins").iterdir()) == [WEATHER_FOLDER]
    row = PluginInstall.objects.order_by("-at", "-pk").first()
    assert (row.ok, row.update, row.previous_version) == (False, True, "1.2.0")


@pytest.mark.parametrize(
    "data, reason",
    [
        (make_zip({**new_version(), "../evil.py": b"x"}), "leads outside the plugin's folder"),
        (make_zip(new_version(host_application={"min_version": "9.0.0", "max_version": "9.9.9"})), "host_application"),
        (b"PK\x03\x04 not really a zip", "not a valid zip archive"),
    ],
)
def test_every_check_of_an_install_applies_before_anything_changes(installer, data_dir, installed, data, reason):
    before = snapshot(installed)
    assert reason in update(installer, data)
    assert snapshot(installed) == before and tree(data_dir / ".plugin-staging") == []


def test_a_swap_failing_half_way_puts_the_old_folder_back(installer, data_dir, installed, monkeypatch):
    from plugins import update as plugin_update

    before, real_rename, calls = snapshot(installed), os.rename, []

    def rename(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:  # the new tree into the old one's place
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(plugin_update.os, "rename", rename)
    text = update(installer, make_zip(new_version()))
    assert "The update failed, the installed version was put back:" in text and "No space left" in text
    aside = calls[0][1]
    assert aside.startswith(f".{WEATHER_FOLDER}.replaced-")
    assert calls == [(WEATHER_FOLDER, aside), ("plugin", WEATHER_FOLDER), (aside, WEATHER_FOLDER)]
    assert snapshot(installed) == before and tree(data_dir / ".plugin-staging") == []
    assert not list(data_dir.glob(f".{WEATHER_FOLDER}.replaced-*"))
    assert not PluginInstall.objects.order_by("-at", "-pk").first().ok


def test_a_swap_that_cannot_even_put_the_old_folder_back_keeps_it_in_the_data_dir_and_says_where(
    installer, data_dir, installed, monkeypatch
):
    from plugins import update as plugin_update

    before, real_rename, calls = snapshot(installed), os.rename, []

    def rename(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) in (2, 3):  # the new tree into place, then the old one back: both refused
            raise OSError(13, "Permission denied")
        real_rename(src, dst)

    monkeypatch.setattr(plugin_update.os, "rename", rename)
    text = update(installer, make_zip(new_version()))
    (kept,) = data_dir.glob(f".{WEATHER_FOLDER}.replaced-*")
    assert len(calls) == 3 and calls[0] == (WEATHER_FOLDER, kept.name)
    assert "could not be put back: it is kept whole in" in text and str(kept) in text, text
    assert "was put back" not in text
    # Nothing half-written and nothing lost: the old version whole where the message says (the staging
    # folder, removed whatever happens, never held it), no half plugin in plugins/.
    assert snapshot(kept) == before
    assert not installed.exists()
    assert tree(data_dir / ".plugin-staging") == []
    assert not PluginInstall.objects.order_by("-at", "-pk").first().ok


def test_the_install_form_still_refuses_an_installed_id(installer, installed):
    before = snapshot(installed)
    data = {"archive": upload(make_zip(new_version())), "plugin_id": WEATHER_ID}
    text = said(installer.post(INSTALL, data, follow=True))
    assert f"the folder {WEATHER_FOLDER}/ exists already" in text and "Nothing was overwritten" in text
    assert snapshot(installed) == before


@pytest.mark.parametrize(
    "target",
    ["", WEATHER_FOLDER, f"../plugins/{WEATHER_FOLDER}", f"{WEATHER_ID}/..", "..", "/etc", "test.maibot/../weather",
     f"{WEATHER_ID}\x00", "test.maibot.outside", "test.maibot.nothere"],
)  # fmt: skip
def test_a_target_that_is_a_path_or_no_installed_plugin_is_refused(installer, data_dir, installed, target):
    outside = data_dir.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "_manifest.json").write_bytes(weather_manifest(id="test.maibot.outside"))
    (data_dir / "plugins" / "outside").symlink_to(outside)  # a folder of plugins/ that is a link out of it
    before, outside_before = snapshot(installed), snapshot(outside)
    text = update(installer, make_zip(new_version(id=target or WEATHER_ID)), plugin_id=target)
    assert "to update" in text and "Refused" in text
    assert snapshot(installed) == before and snapshot(outside) == outside_before
    assert sorted(p.name for p in (data_dir / "plugins").iterdir()) == ["outside", WEATHER_FOLDER]


def test_a_target_in_the_url_is_no_action(installer, installed):
    before = snapshot(installed)
    for url in (f"/admin/plugins/{WEATHER_ID}/update/", "/admin/plugins/..%2F..%2Fetc/update/"):
        response = installer.post(url, {"archive": upload(make_zip(new_version()))})
        assert response.status_code == 404
    assert snapshot(installed) == before


@pytest.mark.parametrize(
    "perms",
    [
        ("maibot.view_console",),
        ("maibot.view_console", "maibot.change_config", "plugins.change_plugin_config"),
        ("maibot.view_console", "plugins.reload_plugin", "plugins.install_plugin_dependencies"),
    ],
)
def test_only_the_install_permission_updates(client, installed, perms):
    before, rows = snapshot(installed), PluginInstall.objects.count()
    client.force_login(staff(*perms))
    response = client.post(UPDATE, {"plugin_id": WEATHER_ID, "archive": upload(make_zip(new_version()))})
    assert response.status_code == 403
    assert 'id="plugin-update-form"' not in client.get("/admin/plugins/").content.decode()
    assert snapshot(installed) == before and PluginInstall.objects.count() == rows


def test_a_post_without_the_csrf_token_and_a_get_update_nothing(installed):
    before = snapshot(installed)
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("maibot.view_console", "plugins.install_plugin"))
    data = {"plugin_id": WEATHER_ID, "archive": upload(make_zip(new_version()))}
    assert client.post(UPDATE, data).status_code == 403
    assert client.get(UPDATE).status_code == 405
    assert snapshot(installed) == before


def test_the_form_lists_the_installed_plugins_in_both_languages(installer, installed):
    en = installer.get("/admin/plugins/", HTTP_ACCEPT_LANGUAGE="en-US,en;q=0.9").content.decode()
    assert 'id="plugin-update-form"' in en and f'<option value="{WEATHER_ID}">' in en
    assert "Update an installed plugin" in en and ">Replace with the new version</button>" in en
    zh = installer.get("/admin/plugins/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9").content.decode()
    assert "更新已安装的插件" in zh and "Update an installed plugin" not in zh
    response = installer.post(
        UPDATE, {"plugin_id": WEATHER_ID, "archive": upload(make_zip(new_version("1.1.0")))},
        HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9", follow=True,
    )  # fmt: skip
    assert "这是一次降级" in said(response) and "从 1.2.0 更新到 1.1.0" in said(response)


def test_an_update_body_over_the_limit_is_refused_by_the_asgi_layer():
    from plugins.upload_limit import limit_plugin_uploads, max_body

    sent = []

    async def app(scope, receive, send):
        pytest.fail("the application saw the request")

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "path": UPDATE,
        "method": "POST",
        "headers": [(b"content-length", str(max_body() + 1).encode())],
    }
    asyncio.run(limit_plugin_uploads(app)(scope, None, send))
    assert sent[0]["status"] == 413


@pytest.fixture
def running_host(data_dir, installed, monkeypatch):
    """The server's plugin host on the plugins folder with the installed plugin, without a watcher."""
    with host_on(data_dir / "plugins", monkeypatch) as host:
        yield host


@pytest.mark.django_db(transaction=True)
def test_the_running_host_reloads_the_updated_plugin(installer, running_host):
    assert running_host.records[WEATHER_ID].version == "1.2.0"
    text = update(installer, make_zip(new_version()))
    assert "Reloaded: update from the console: loaded" in text
    record = running_host.records[WEATHER_ID]
    assert (record.state, record.version) == ("loaded", "1.3.0")


def test_a_git_url_updates_too(installer, data_dir, installed, tmp_path, settings):
    settings.MAIBOT_PLUGIN_INSTALL_GIT_SCHEMES = ("https", "http")
    (tmp_path / "repos").mkdir()
    bare_repo(tmp_path / "repos", "weather", new_version())
    with GitServer(tmp_path / "repos") as server:
        response = installer.post(
            UPDATE, {"plugin_id": WEATHER_ID, "git_url": f"{server.base}/weather.git"}, follow=True
        )
    assert "from 1.2.0 to 1.3.0" in said(response)
    assert (installed / "plugin.py").read_bytes() == NEW_PLUGIN
    assert (installed / "config.toml").read_bytes() == OPERATOR_CONFIG
    row = PluginInstall.objects.order_by("-at", "-pk").first()
    assert (row.source, row.update, row.ok) == ("git", True, True) and len(row.revision) == 40
