"""Installing a plugin from a git URL (plugins.install_git) through the console's Install form, against a
git server this test starts on 127.0.0.1 (git's smart HTTP, tests/plugins/git_server.py). Production
takes https:// only; these tests widen it to http:// with the explicit setting, and only where they
clone from that server. Every other transport, a local path, a redirect, a symlink, a repository too
large or too slow, a bad manifest, and the server user's own git config and hooks are shown to fail or
to be ignored, with nothing written to the plugins folder."""

from __future__ import annotations

import os
import subprocess
from urllib.parse import quote

import pytest

from plugins.models import PluginInstall
from tests.plugins.git_server import GitServer, bare_repo
from tests.plugins.install_helpers import (
    WEATHER_FOLDER,
    WEATHER_ID,
    assert_nothing_written,
    plugin_files,
    tree,
    weather_manifest,
)

pytestmark = [pytest.mark.django_db, pytest.mark.backend_independent]

URL = "/admin/plugins/install/"
FILES = plugin_files()


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "repos"
    root.mkdir()
    bare_repo(root, "weather", FILES)
    with GitServer(root) as running:
        yield running


@pytest.fixture
def http_allowed(settings):
    settings.MAIBOT_PLUGIN_INSTALL_GIT_SCHEMES = ("https", "http")


def install(client, url: str) -> str:
    response = client.post(URL, {"git_url": url}, follow=True)
    assert response.status_code == 200
    return " ".join(str(m) for m in response.context["messages"])


def test_a_git_url_is_cloned_shallow_and_installed_without_its_git_folder(installer, data_dir, server, http_allowed):
    said = install(installer, f"{server.base}/weather.git")
    folder = data_dir / "plugins" / WEATHER_FOLDER
    assert f"Installed Weather (test plugin) 1.2.0 ({WEATHER_ID}) into plugins/{WEATHER_FOLDER}/." in said
    assert sorted(tree(folder)) == sorted(FILES)  # no .git
    row = PluginInstall.objects.get()
    head = subprocess.run(
        ["git", "-C", str(server.root / "weather.git"), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert (row.ok, row.source, row.origin, row.revision) == (True, "git", f"{server.base}/weather.git", head)
    assert tree(data_dir / ".plugin-staging") == []


def test_production_takes_https_only(installer, data_dir, server, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("git ran"))
    said = install(installer, f"{server.base}/weather.git")
    assert "is not a URL git may fetch" in said and "Only https:// URLs" in said
    assert_nothing_written(data_dir) and server.requests == []


@pytest.mark.parametrize(
    "url",
    [
        "file:///{repos}/weather.git",
        "{repos}/weather.git",
        "./weather.git",
        "ssh://git@127.0.0.1/weather.git",
        "git@127.0.0.1:weather.git",
        "git://127.0.0.1/weather.git",
        "ext::sh -c touch% /tmp/pwned",
        "ext::sh",
        "-uhttp://127.0.0.1/weather.git",
        "http://user:secret@127.0.0.1/weather.git",
        "http:///weather.git",
    ],
)
def test_other_transports_local_paths_options_and_credentials_are_refused_before_git_runs(
    installer, data_dir, server, http_allowed, monkeypatch, url
):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("git ran"))
    said = install(installer, url.format(repos=server.root))
    assert "Refused" in said
    assert_nothing_written(data_dir)
    assert not os.path.exists("/tmp/pwned")
    assert not PluginInstall.objects.get().ok


def test_a_redirect_to_a_local_repository_is_not_followed(installer, data_dir, server, http_allowed):
    target = quote(f"file://{server.root}/weather.git", safe="")
    said = install(installer, f"{server.base}/redirect/{target}")
    assert "git clone failed" in said
    assert_nothing_written(data_dir)
    # Not even to a URL of an accepted scheme: redirects are not followed at all.
    said = install(installer, f"{server.base}/redirect/{quote(server.base + '/weather.git', safe='')}")
    assert "git clone failed" in said
    assert_nothing_written(data_dir)


def test_a_repository_with_a_symlink_is_refused(installer, data_dir, server, http_allowed):
    bare_repo(server.root, "linked", FILES, symlinks={"secrets.py": "/etc/passwd"})
    said = install(installer, f"{server.base}/linked.git")
    assert "the repository holds a symbolic link: secrets.py" in said
    assert_nothing_written(data_dir)


def test_a_repository_over_the_size_limit_is_refused(installer, data_dir, server, http_allowed, settings):
    settings.MAIBOT_PLUGIN_INSTALL_MAX_UNPACKED = 100 * 1024
    bare_repo(server.root, "big", {**FILES, "blob.bin": os.urandom(400 * 1024)})
    said = install(installer, f"{server.base}/big.git")
    assert "Refused: the repository is larger than 100 KiB." in said or "at most 100 KiB is allowed" in said
    assert_nothing_written(data_dir)


def test_a_clone_that_takes_too_long_is_killed(installer, data_dir, server, http_allowed, settings):
    settings.MAIBOT_PLUGIN_INSTALL_GIT_TIMEOUT = 1.5
    said = install(installer, f"{server.base}/slow/weather.git")
    assert "Refused: git clone took more than 1.5 seconds." in said
    assert_nothing_written(data_dir)


def test_a_bad_manifest_in_the_repository_is_refused(installer, data_dir, server, http_allowed):
    bare_repo(server.root, "bad", {**FILES, "_manifest.json": weather_manifest(version="one")})
    said = install(installer, f"{server.base}/bad.git")
    assert "the plugin's manifest is not accepted: _manifest.json: version: must be a strict X.Y.Z version" in said
    assert_nothing_written(data_dir)


def test_the_server_users_git_config_and_hooks_are_not_used(
    installer, data_dir, server, http_allowed, tmp_path, monkeypatch
):
    home, marker = tmp_path / "home", tmp_path / "hook-ran"
    (home / "hooks").mkdir(parents=True)
    hook = home / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    # A config that would send the clone elsewhere and run a hook after checkout.
    (home / ".gitconfig").write_text(
        f'[core]\n\thooksPath = {home / "hooks"}\n[url "file://{server.root}/"]\n\tinsteadOf = {server.base}/\n'
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    said = install(installer, f"{server.base}/weather.git")
    assert "Installed" in said
    assert not marker.exists()
    assert any(r.startswith("/weather.git/info/refs") for r in server.requests)  # fetched from the server
