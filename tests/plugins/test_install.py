"""The console's Install form (plugins.install, plugins.install_views) with Django's test client, as an
operator uses it and as an attacker would: a zip of a plugin is installed into plugins/<folder> only
once its manifest passed; every archive that could write outside the plugin's folder, a link, a bomb, a
huge upload, a bad manifest, a plugin already there, a user without the install permission (one who may
change the config included) and a post without CSRF token leave the plugins folder as it was, say why,
and are recorded."""

from __future__ import annotations

import os
import shutil

import pytest
from django.test import Client

from plugins.models import PluginInstall
from tests.plugins.conftest import host_on
from tests.plugins.install_helpers import (
    BLOCK_DEVICE,
    FIFO,
    SYMLINK,
    WEATHER_FOLDER,
    WEATHER_ID,
    assert_nothing_written,
    lying_zip,
    make_zip,
    plugin_files,
    staff,
    tree,
    upload,
    weather_manifest,
    with_entry,
)

pytestmark = [pytest.mark.django_db, pytest.mark.backend_independent]

URL = "/admin/plugins/install/"


def post(client: Client, data: bytes, name: str = "weather.zip"):
    response = client.post(URL, {"archive": upload(data, name)}, follow=True)
    assert response.status_code == 200
    return response, " ".join(str(m) for m in response.context["messages"])


def test_a_zip_with_the_manifest_at_its_root_is_installed_and_recorded(installer, data_dir):
    response, said = post(installer, make_zip(plugin_files()))
    folder = data_dir / "plugins" / WEATHER_FOLDER
    assert f"Installed Weather (test plugin) 1.2.0 ({WEATHER_ID}) into plugins/{WEATHER_FOLDER}/." in said
    assert sorted(tree(folder)) == sorted(plugin_files())
    assert (folder / "plugin.py").stat().st_mode & 0o777 == 0o644 and folder.stat().st_mode & 0o777 == 0o755
    assert tree(data_dir / ".plugin-staging") == []
    row = PluginInstall.objects.get()
    assert (row.ok, row.plugin_id, row.version, row.folder, row.source, row.origin) == (
        True, WEATHER_ID, "1.2.0", WEATHER_FOLDER, "zip", "weather.zip",
    )  # fmt: skip
    assert row.user.username.startswith("staff") and row.revision.startswith("sha256:")
    page = response.content.decode()
    assert 'id="plugin-install-form"' in page and WEATHER_ID in page.split('id="plugin-installs"')[1]


def test_a_zip_with_one_top_folder_is_installed_as_githubs_download_zip_lays_it_out(installer, data_dir):
    files = plugin_files()
    _, said = post(installer, make_zip({**files, "README.md": b"# weather\n"}, prefix="weather-plugin-main/"))
    assert "Installed" in said
    assert sorted(tree(data_dir / "plugins" / WEATHER_FOLDER)) == sorted([*files, "README.md"])


FILES = plugin_files()
ATTACKS = {
    "parent": (with_entry(FILES, "../evil.py"), "leads outside the plugin's folder"),
    "parent inside": (with_entry(FILES, "helpers/../../../evil.py"), "leads outside the plugin's folder"),
    "absolute": (with_entry(FILES, "/tmp/evil.py"), "is an absolute path"),
    "drive": (with_entry(FILES, "C:/evil.py"), "is an absolute path"),
    "backslash": (with_entry(FILES, "..\\evil.py"), "has a backslash"),
    "symlink": (with_entry(FILES, "link.py", b"/etc/passwd", SYMLINK), "is a symbolic link"),
    "fifo": (with_entry(FILES, "pipe", b"", FIFO), "is not a plain file or folder"),
    "device": (with_entry(FILES, "disk", b"", BLOCK_DEVICE), "is not a plain file or folder"),
    "twice": (with_entry(FILES, "plugin.py", b"import os\n"), "appears twice"),
    "bomb": (with_entry(FILES, "zeros.bin", b"\0" * (65 * 1024 * 1024)), "unpacks to 65"),
    "lying sizes": (lying_zip(FILES, "big.py", b"#" * 100_000, 10), "not a valid zip archive"),
    "not a zip": (b"PK\x03\x04 not really a zip", "not a valid zip archive"),
    "two top folders": (
        make_zip({"a/_manifest.json": FILES["_manifest.json"], "b/plugin.py": b""}),
        "no _manifest.json at the archive's root",
    ),
    "no plugin.py": (make_zip({"_manifest.json": FILES["_manifest.json"]}), "no plugin.py"),
    "bad id": (make_zip({**FILES, "_manifest.json": weather_manifest(id="bad id")}), "id: must be letters"),
    "host range": (
        make_zip({**FILES, "_manifest.json": weather_manifest(host_application={"min_version": "9.0.0",
                                                                               "max_version": "9.9.9"})}),
        "host_application needs MaiBot >= 9.0.0",
    ),
}  # fmt: skip


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_archive_that_could_harm_is_refused_with_its_reason_and_nothing_written(
    installer, data_dir, attack, monkeypatch
):
    data, reason = ATTACKS[attack]
    if attack in ("bomb", "parent", "symlink", "absolute"):
        # Refused from the archive's directory alone: not one entry is unpacked.
        from plugins import install

        monkeypatch.setattr(install, "_unpack", lambda *a: pytest.fail("an entry was unpacked"))
    _, said = post(installer, data)
    assert reason in said and "Refused" in said
    assert_nothing_written(data_dir)
    assert not (data_dir.parent / "evil.py").exists() and not (data_dir / "evil.py").exists()
    row = PluginInstall.objects.get()
    assert not row.ok and reason in row.detail and row.folder == ""


def test_an_archive_of_too_many_entries_is_refused_before_unpacking(installer, data_dir, settings):
    settings.MAIBOT_PLUGIN_INSTALL_MAX_ENTRIES = 10
    files = {**FILES, **{f"data/{i}.txt": b"" for i in range(10)}}
    _, said = post(installer, make_zip(files))
    assert f"has {len(files)} entries; at most 10 are allowed" in said
    assert_nothing_written(data_dir)


def test_an_upload_over_the_limit_is_refused_unread(installer, data_dir, settings, monkeypatch):
    settings.MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD = 100 * 1024
    from plugins import install

    monkeypatch.setattr(install, "sha256_of", lambda *a: pytest.fail("the upload was read"))
    # Over the limit with the form around it: refused by its Content-Length, before the body is parsed.
    _, said = post(installer, make_zip({**FILES, "noise.bin": os.urandom(200 * 1024)}))
    assert "Refused: the upload is larger than 100 KiB." in said
    assert_nothing_written(data_dir)
    # Over the limit by the file alone (the form's margin): refused by the file's size.
    _, said = post(installer, make_zip({**FILES, "noise.bin": os.urandom(120 * 1024)}))
    assert "MiB; at most 100 KiB is allowed." in said or "KiB; at most 100 KiB is allowed." in said
    assert_nothing_written(data_dir)


def test_a_plugin_already_there_is_never_overwritten(installer, data_dir):
    post(installer, make_zip(FILES))
    folder = data_dir / "plugins" / WEATHER_FOLDER
    (folder / "plugin.py").write_text("# the operator's own edit\n")
    _, said = post(installer, make_zip(FILES))
    assert f"the folder {WEATHER_FOLDER}/ exists already" in said and "Nothing was overwritten" in said
    assert (folder / "plugin.py").read_text() == "# the operator's own edit\n"
    # The same id in a folder of another name (copied in by hand) is found too.
    folder.rename(data_dir / "plugins" / "weather")
    _, said = post(installer, make_zip(FILES))
    assert f"the plugin {WEATHER_ID} is installed already (in weather/)" in said
    assert tree(data_dir / "plugins") == ["weather", *(f"weather/{n}" for n in sorted(FILES))]
    assert [r.ok for r in PluginInstall.objects.order_by("at")] == [True, False, False]


@pytest.mark.parametrize(
    "perms",
    [
        (),
        ("maibot.view_console",),
        # Installing code is not config: who may change the bot's config may not install a plugin.
        ("maibot.view_console", "maibot.change_config"),
        ("maibot.view_console", "plugins.reload_plugin", "plugins.install_plugin_dependencies"),
    ],
)
def test_only_the_install_permission_installs(client, data_dir, perms):
    client.force_login(staff(*perms))
    response = client.post(URL, {"archive": upload(make_zip(FILES))})
    assert response.status_code == 403
    if "maibot.view_console" in perms:
        assert 'id="plugin-install-form"' not in client.get("/admin/plugins/").content.decode()
    assert_nothing_written(data_dir)
    assert not PluginInstall.objects.exists()


def test_a_visitor_is_sent_to_the_login_and_nothing_is_installed(client, data_dir):
    response = client.post(URL, {"archive": upload(make_zip(FILES))})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert_nothing_written(data_dir)


def test_a_post_without_the_csrf_token_and_a_get_install_nothing(data_dir):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff("maibot.view_console", "plugins.install_plugin"))
    assert client.post(URL, {"archive": upload(make_zip(FILES))}).status_code == 403
    assert client.get(URL).status_code == 405
    assert_nothing_written(data_dir)


def test_neither_or_both_of_zip_and_url_is_refused(installer, data_dir):
    response = installer.post(URL, {}, follow=True)
    assert "Give either a zip file or a git URL." in " ".join(str(m) for m in response.context["messages"])
    response = installer.post(URL, {"archive": upload(make_zip(FILES)), "git_url": "https://x.invalid/p"}, follow=True)
    assert "Give either a zip file or a git URL." in " ".join(str(m) for m in response.context["messages"])
    assert_nothing_written(data_dir)


@pytest.fixture
def running_host(data_dir, monkeypatch):
    """The server's plugin host on the test's empty plugins folder, without a watcher."""
    with host_on(data_dir / "plugins", monkeypatch) as host:
        yield host


@pytest.mark.django_db(transaction=True)
def test_an_installed_plugin_loads_and_can_be_disabled_and_enabled(client, running_host):
    client.force_login(
        staff("maibot.view_console", "plugins.install_plugin", "plugins.enable_plugin", "plugins.disable_plugin")
    )
    response, said = post(client, make_zip(FILES))
    assert "new plugin: loaded" in said
    record = running_host.records[WEATHER_ID]
    assert record.state == "loaded" and record.folder.name == WEATHER_FOLDER
    row = f'data-plugin="{WEATHER_ID}"'
    assert row in response.content.decode()
    assert client.post(f"/admin/plugins/{WEATHER_ID}/disable/").status_code == 302
    assert record.state == "disabled"
    assert client.post(f"/admin/plugins/{WEATHER_ID}/enable/").status_code == 302
    assert record.state == "loaded"
    assert "new plugin: loaded" in PluginInstall.objects.get().detail


@pytest.mark.django_db(transaction=True)
def test_rescan_loads_a_folder_copied_in_and_unloads_one_removed(client, running_host, data_dir):
    from tests.plugins.conftest import copy_plugins

    client.force_login(staff("maibot.view_console", "plugins.reload_plugin"))
    copy_plugins(data_dir / "plugins", "weather")
    response = client.post("/admin/plugins/rescan/", follow=True)
    assert "new plugin: loaded" in " ".join(str(m) for m in response.context["messages"])
    assert running_host.records[WEATHER_ID].state == "loaded"
    shutil.rmtree(data_dir / "plugins" / "weather")
    response = client.post("/admin/plugins/rescan/", follow=True)
    assert "its folder weather/ was removed" in " ".join(str(m) for m in response.context["messages"])
    assert running_host.records[WEATHER_ID].state == "removed"
    response = client.post("/admin/plugins/rescan/", follow=True)
    assert "nothing new and nothing removed" in " ".join(str(m) for m in response.context["messages"])
    # Who may only view may not rescan.
    client.force_login(staff("maibot.view_console"))
    assert client.post("/admin/plugins/rescan/").status_code == 403


def test_the_form_and_the_permission_are_in_chinese_and_english(installer, data_dir):
    from django.contrib.auth.models import Permission
    from django.utils import translation

    from console.permissions import permission_name

    zh = installer.get("/admin/plugins/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9").content.decode()
    assert "添加插件" in zh and "插件的 zip 文件" in zh and ">安装</button>" in zh and "从控制台安装的插件" in zh
    en = installer.get("/admin/plugins/", HTTP_ACCEPT_LANGUAGE="en-US,en;q=0.9").content.decode()
    assert "Add a plugin" in en and ">Install</button>" in en and "添加插件" not in en
    permission = Permission.objects.get(content_type__app_label="plugins", codename="install_plugin")
    with translation.override("zh-hans"):
        assert permission_name(permission) == "可安装插件（上传 zip 或 git 地址：机器人会运行的代码）"
    with translation.override("en"):
        assert permission_name(permission) == "Can install a plugin (a zip upload or a git URL: code the bot runs)"
    response = installer.post(URL, {}, HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9", follow=True)
    assert "请提供 zip 文件或 git 地址（二选一）。" in " ".join(str(m) for m in response.context["messages"])


def test_the_folders_an_interrupted_install_left_are_removed_as_the_host_starts(data_dir, caplog):
    """A process killed mid-install leaves its staging folder (an install removes its own whatever its
    outcome): the plugin host removes such folders as it starts, but not one an install in another
    process (a shared data dir) is still writing."""
    import os
    import time

    from plugins import host

    stale, fresh = data_dir / ".plugin-staging" / "tmpstale", data_dir / ".plugin-staging" / "tmpfresh"
    for stage in (stale, fresh):
        (stage / "weather").mkdir(parents=True)
        (stage / "weather" / "plugin.py").write_text("# half unpacked\n")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    try:
        host.start()
    finally:
        host.stop()
    assert not stale.exists()
    assert (fresh / "weather" / "plugin.py").exists()
    assert "removed 1 plugin install folders left by an interrupted install" in caplog.text
