"""Installing a plugin's missing Python dependencies with pip, never from the network: a wheel built in the
test, served by a PEP 503 index in a folder (MAIBOT_PIP_INDEX_URL=file://…), installed into a target
directory of the test (pip's own PIP_TARGET, then put on sys.path as the bot's site-packages would be).
Automatic at load (the deployment's MAIBOT_PLUGIN_AUTO_INSTALL), the admin action, the command; and the
attacks: a `change_config` user choosing pip's arguments, a manifest naming a URL, a package that runs
its build script, pip's output read by a non-superuser."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command

from core import config
from plugins import deps
from plugins import host as plugin_host
from plugins import manifest as mf
from plugins.host import PluginState
from tests.conftest import ROOT, subprocess_env
from tests.console.test_console_config_editor import form_data_from
from tests.plugins.conftest import FIXTURES, copy_plugins

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

NEEDS_PACKAGE = "test.maibot.needs-package"
PACKAGE = "maibot-test-missing-package"
DISTRIBUTION = "maibot_test_missing_package"


def build_wheel(directory: Path, version: str = "1.0") -> Path:
    """A real (tiny) wheel of maibot-test-missing-package, the dependency the needs_package plugin declares."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"{DISTRIBUTION}-{version}.dist-info"
    files = {
        f"{DISTRIBUTION}/__init__.py": "ANSWER = 42\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: maibot-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{DISTRIBUTION}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def build_sdist(directory: Path, marker: Path, version: str = "1.0") -> Path:
    """A source distribution of maibot-test-missing-package whose setup.py writes `marker` when run."""
    directory.mkdir(parents=True, exist_ok=True)
    base = f"{DISTRIBUTION}-{version}"
    files = {
        f"{base}/setup.py": f"open({str(marker)!r}, 'w').write('setup.py ran')\n"
        f"from setuptools import setup\nsetup(name={PACKAGE!r}, version={version!r})\n",
        f"{base}/PKG-INFO": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n",
    }
    sdist = directory / f"{base}.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return sdist


def simple_index(root: Path, *files: Path) -> str:
    """A PEP 503 index in `root` listing `files` under maibot-test-missing-package; its file:// URL."""
    project = root / PACKAGE
    project.mkdir(parents=True, exist_ok=True)
    links = "".join(f'<a href="{f.as_uri()}">{f.name}</a>\n' for f in files)
    (project / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return root.as_uri() + "/"


@pytest.fixture
def pip_sandbox(tmp_path, monkeypatch, settings) -> Path:
    """pip of this test installs into tmp_path/site (on sys.path) and reads no index but the test's."""
    target = tmp_path / "site"
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no pip.conf of this machine (its indexes, find-links)
    monkeypatch.setenv("PIP_TARGET", str(target))  # the deployment's own pip setting: passed through
    monkeypatch.syspath_prepend(str(target))
    settings.MAIBOT_PIP_INDEX_URL = simple_index(tmp_path / "empty-index")
    settings.MAIBOT_PIP_EXTRA_INDEX_URLS = []
    settings.MAIBOT_PLUGIN_AUTO_INSTALL = False
    return target


@pytest.fixture
def local_index(tmp_path, pip_sandbox, settings) -> Path:
    """The index serves a wheel of the missing package; returns the install target."""
    settings.MAIBOT_PIP_INDEX_URL = simple_index(tmp_path / "index", build_wheel(tmp_path / "wheels"))
    return pip_sandbox


def _plugin_with_dependency(directory: Path, **dependency: str) -> Path:
    """A copy of needs_package whose one package dependency is `dependency`."""
    copy_plugins(directory, "needs_package")
    path = directory / "needs_package" / mf.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["dependencies"] = [{"type": "python_package", **dependency}]
    path.write_text(json.dumps(manifest))
    return directory


def _staff(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def test_missing_dependencies_are_installed_at_load_when_the_deployment_enables_it(load_plugins, local_index, settings):
    settings.MAIBOT_PLUGIN_AUTO_INSTALL = True
    host = load_plugins("needs_package")
    record = host.records[NEEDS_PACKAGE]
    assert record.state == PluginState.LOADED, record.reason
    assert record.last_install.ok and record.last_install.summary == f"installed: {PACKAGE}>=1.0"
    assert (local_index / DISTRIBUTION / "__init__.py").is_file()


def test_a_change_config_user_cannot_choose_pips_arguments_or_turn_installs_on(
    load_plugins, local_index, client, tmp_path, settings, caplog
):
    """The attack of issue #25: a staff user with only change_config saved pip_args = ["--no-index", "-r",
    "<data dir>/deployment.env"] and auto_install_dependencies = true; the next install logged the file's
    lines into the live log. Now both keys are gone from the config: the save is accepted (an old file
    with them must still load), they change nothing, and no install reads the file."""
    data_dir = Path(settings.DATA_DIR)
    secrets_file = tmp_path / "deployment.env"
    secrets_file.write_text("OPENAI_API_KEY=sk-secret-from-deployment-env\n")
    evil = (
        "[plugins]\nauto_install_dependencies = true\n"
        f'pip_args = ["--no-index", "-r", "{secrets_file}", "{tmp_path}/local-package"]\n'
    )
    client.force_login(_staff("editor", "view_console", "change_config"))
    config.ensure_config_file()
    page = client.get("/admin/config/raw/")
    saved = client.post(
        "/admin/config/raw/", {"toml": evil, "base_digest": page.context["base_digest"]}, follow=True
    ).content.decode()
    assert "plugins.pip_args is no longer a bot config setting and is ignored" in saved
    assert (data_dir / "bot_config.toml").read_text() == evil  # the operator's text is kept as written
    assert not hasattr(config.get_config().plugins, "pip_args")

    caplog.set_level(logging.DEBUG)
    host = load_plugins("needs_package")  # with the keys above in force: no automatic install
    record = host.records[NEEDS_PACKAGE]
    assert record.state == PluginState.REFUSED and record.last_install is None and not local_index.exists()
    outcome = host.install_dependencies(NEEDS_PACKAGE)  # an operator installs: our arguments only
    assert outcome.ok, outcome.message
    assert "sk-secret-from-deployment-env" not in caplog.text + record.last_install.output
    assert str(secrets_file) not in record.last_install.output


def test_the_install_action_needs_its_permission_and_only_superusers_see_pips_output(
    load_plugins, local_index, client, monkeypatch, caplog
):
    host = load_plugins("needs_package")
    monkeypatch.setattr(plugin_host, "host", host)
    record = host.records[NEEDS_PACKAGE]
    assert record.reason == f"missing Python dependencies: {PACKAGE}>=1.0 (not installed)"
    staff = _staff("operator", "view_console")
    client.force_login(staff)
    url = f"/admin/plugins/{NEEDS_PACKAGE}/install-deps/"
    assert client.post(url).status_code == 403
    assert not local_index.exists() and record.state == PluginState.REFUSED
    staff.user_permissions.add(Permission.objects.get(codename="install_plugin_dependencies"))
    caplog.set_level(logging.INFO)
    page = client.post(url, follow=True).content.decode()
    assert record.state == PluginState.LOADED and record.runner_pid
    assert f"installed: {PACKAGE}&gt;=1.0; install dependencies: loaded" in page
    assert "Successfully installed" in record.last_install.output  # pip's own words, kept on the record…
    assert "pip output" not in page and "Successfully installed" not in page  # …not shown to staff
    assert "Successfully installed" not in caplog.text  # …nor logged (the live log page)
    assert f"plugin dependencies installed: {PACKAGE}>=1.0" in caplog.text
    client.force_login(User.objects.create_superuser("root", password="pw"))
    assert "Successfully installed" in client.get("/admin/plugins/").content.decode()


@pytest.mark.parametrize(
    "version_spec",
    ["@ file:///tmp/evil-package", " @ https://evil.example/pkg-1.0-py3-none-any.whl", "@git+https://x/y"],
)
def test_a_manifest_naming_a_url_or_path_is_refused_and_nothing_is_installed(
    load_plugins, pip_sandbox, settings, tmp_path, version_spec
):
    settings.MAIBOT_PLUGIN_AUTO_INSTALL = True
    directory = _plugin_with_dependency(tmp_path / "plugins", name=PACKAGE, version_spec=version_spec)
    host = plugin_host.PluginHost()
    try:
        host.load_all(directory)
        record = host.records[NEEDS_PACKAGE]
        assert record.state == PluginState.REFUSED
        assert "a direct URL or path is not allowed" in record.reason
        assert record.last_install is None and not pip_sandbox.exists()
    finally:
        host.stop()


@pytest.mark.parametrize("name", ["-r", "--index-url", "./evil", "/etc/passwd", "evil.whl.", "a b"])
def test_a_package_name_that_is_an_option_or_a_path_is_refused(name):
    manifest = json.loads((FIXTURES / "needs_package" / mf.MANIFEST_FILE).read_text())
    manifest["dependencies"] = [{"type": "python_package", "name": name, "version_spec": ">=1"}]
    with pytest.raises(Exception, match="a package name has only letters"):
        mf.Manifest.model_validate(manifest)


def test_requirements_reach_pip_as_canonical_names_after_the_options_with_the_deployments_index(settings):
    """An archive-like name (`evil.whl`, a file pip would install from the folder) is passed canonical."""
    settings.MAIBOT_PIP_INDEX_URL = "https://mirror.example/simple/"
    settings.MAIBOT_PIP_EXTRA_INDEX_URLS = ["https://extra.example/simple/"]
    dep = mf.PythonPackageDependency(type="python_package", name="Evil.whl", version_spec="[Socks]>=1.0")
    assert str(dep.requirement) == "evil-whl[Socks]>=1.0"
    command = deps.pip_command([str(dep.requirement)], constraints=Path("/c.txt"))
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert command[-2:] == ["--", "evil-whl[Socks]>=1.0"]
    options = command[4:-2]
    assert "--only-binary=:all:" in options and options[options.index("--constraint") + 1] == "/c.txt"
    assert options[options.index("--index-url") + 1] == "https://mirror.example/simple/"
    assert options[options.index("--extra-index-url") + 1] == "https://extra.example/simple/"


def test_a_dependency_whose_marker_does_not_apply_is_not_missing():
    manifest = json.loads((FIXTURES / "needs_package" / mf.MANIFEST_FILE).read_text())
    manifest["dependencies"] = [
        {"type": "python_package", "name": PACKAGE, "version_spec": '>=1.0; python_version < "3"'}
    ]
    assert mf.missing_packages(mf.Manifest.model_validate(manifest)) == []


def test_a_package_that_only_ships_source_is_not_built(local_index, tmp_path, settings, monkeypatch):
    """--only-binary: a source distribution's setup.py would run as the server's user at install time."""
    # Built with the bot's own setuptools (no index here serves one): without --only-binary, pip runs
    # the setup.py below (and writes the marker) before anything else can fail.
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")
    marker = tmp_path / "setup-py-ran"
    settings.MAIBOT_PIP_INDEX_URL = simple_index(tmp_path / "sdist-index", build_sdist(tmp_path / "sdists", marker))
    outcome = deps.install([f"{PACKAGE}>=1.0"])
    assert not outcome.ok and outcome.reason == "pip exited with status 1"
    assert not marker.exists() and not local_index.exists()


def test_an_installed_package_is_never_changed(pip_sandbox):
    """A plugin asking for another version of a package the bot runs on is refused without pip."""
    outcome = deps.install(["pydantic<2"])
    assert not outcome.ok
    assert "already installed at another version, which a plugin may not change: pydantic<2" in outcome.summary
    assert not pip_sandbox.exists()
    assert "pydantic==" in "\n".join(deps.installed_pins())  # and pip's constraints pin what is installed


def test_install_refuses_a_requirement_it_did_not_build(pip_sandbox):
    for requirement in ["x @ file:///etc", "-r/etc/passwd", "x>=1 --index-url=https://evil"]:
        outcome = deps.install([requirement])
        assert not outcome.ok and "not a plain requirement" in outcome.reason
    assert not pip_sandbox.exists()


def test_pip_sees_no_secret_of_the_servers_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-server")
    monkeypatch.setenv("MAIBOT_ADAPTER_TOKENS", "qq:tok")
    monkeypatch.setenv("SECRET_KEY", "django-secret")
    monkeypatch.setenv("PIP_INDEX_URL", "https://deployment.example/simple/")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    env = deps._pip_environment()
    assert not {"OPENAI_API_KEY", "MAIBOT_ADAPTER_TOKENS", "SECRET_KEY"} & set(env)
    assert env["PIP_INDEX_URL"] == "https://deployment.example/simple/" and env["HTTPS_PROXY"] == "http://proxy:3128"


def test_an_index_setting_that_is_no_url_stops_start_up_naming_it(tmp_path):
    env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path), MAIBOT_PIP_INDEX_URL="-r/etc/passwd")
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "MAIBOT_PIP_INDEX_URL: '-r/etc/passwd' is not an http(s):// or file://" in (
        done.stderr
    )


def test_the_install_deps_command_reports_what_pip_could_not_install(tmp_path, settings, pip_sandbox):
    settings.DATA_DIR = str(tmp_path / "data")
    copy_plugins(tmp_path / "data" / "plugins", "needs_package", "weather")
    with pytest.raises(CommandError, match="could not be installed"):
        call_command("plugins", "install-deps", NEEDS_PACKAGE)
    with pytest.raises(CommandError, match="no such plugin: nope"):
        call_command("plugins", "install-deps", "nope")


def test_an_old_config_with_the_retired_keys_loads_and_a_form_save_drops_them(client, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    old = '[bot]\nnickname = "Old"\n\n[plugins]\nauto_install_dependencies = true\npip_args = ["--no-index"]\n'
    (tmp_path / "bot_config.toml").write_text(old)
    assert config.reload_config().bot.nickname == "Old"  # not "unknown key": the file still loads
    client.force_login(_staff("editor", "view_console", "change_config"))
    page = client.get("/admin/config/").content.decode()
    assert "plugins.auto_install_dependencies is no longer a bot config setting" in page
    data = form_data_from(page)
    data["bot__nickname"] = "New"
    assert client.post("/admin/config/", data).status_code == 302
    saved = (tmp_path / "bot_config.toml").read_text()
    assert 'nickname = "New"' in saved and "pip_args" not in saved and "auto_install" not in saved
