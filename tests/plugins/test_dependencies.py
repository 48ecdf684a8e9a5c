"""Installing a plugin's missing Python dependencies with pip, never from the network: a wheel built in
the test, installed with --no-index --find-links into a --target directory of the test (then put on
sys.path, as the bot's site-packages would be). Automatic at load, the admin action, the command."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command

from maibot import config
from plugins import host as plugin_host
from plugins.host import PluginState
from tests.plugins.conftest import copy_plugins

pytestmark = pytest.mark.django_db(transaction=True)

NEEDS_PACKAGE = "test.maibot.needs-package"
DISTRIBUTION = "maibot_test_missing_package"


def build_wheel(directory: Path, version: str = "1.0") -> Path:
    """A real (tiny) wheel of maibot-test-missing-package, the dependency the needs_package plugin declares."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"{DISTRIBUTION}-{version}.dist-info"
    files = {
        f"{DISTRIBUTION}/__init__.py": "ANSWER = 42\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: maibot-test-missing-package\nVersion: {version}\n",
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


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip_args pointing at a local wheel directory only, installing into the test's target dir."""
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    build_wheel(wheels)
    monkeypatch.syspath_prepend(str(target))
    pip_args = ["--no-index", "--find-links", str(wheels), "--target", str(target)]
    return pip_args, target


def test_missing_dependencies_are_installed_at_load_when_configured(load_plugins, local_index):
    pip_args, target = local_index
    with config.override(plugins={"auto_install_dependencies": True, "pip_args": pip_args}):
        host = load_plugins("needs_package")
    record = host.records[NEEDS_PACKAGE]
    assert record.state == PluginState.LOADED, record.reason
    assert record.last_install.ok and record.last_install.summary == "installed: maibot-test-missing-package>=1.0"
    assert (target / DISTRIBUTION / "__init__.py").is_file()


def test_the_install_action_needs_its_permission_then_installs_and_loads_the_plugin(
    load_plugins, local_index, client, monkeypatch
):
    pip_args, target = local_index
    host = load_plugins("needs_package")
    monkeypatch.setattr(plugin_host, "host", host)
    record = host.records[NEEDS_PACKAGE]
    assert record.reason == "missing Python dependencies: maibot-test-missing-package>=1.0 (not installed)"
    staff = User.objects.create_user("operator", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_console"))
    client.force_login(staff)
    url = f"/admin/plugins/{NEEDS_PACKAGE}/install-deps/"
    with config.override(plugins={"pip_args": pip_args}):
        assert client.post(url).status_code == 403
        assert not target.exists() and record.state == PluginState.REFUSED
        staff.user_permissions.add(Permission.objects.get(codename="install_plugin_dependencies"))
        page = client.post(url, follow=True).content.decode()
    assert record.state == PluginState.LOADED and record.runner_pid
    assert "installed: maibot-test-missing-package&gt;=1.0; install dependencies: loaded" in page


def test_the_install_deps_command_reports_what_pip_could_not_install(tmp_path, settings):
    settings.DATA_DIR = str(tmp_path / "data")
    copy_plugins(tmp_path / "data" / "plugins", "needs_package", "weather")
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    args = ["--no-index", "--find-links", str(empty), "--target", str(tmp_path / "site")]
    with config.override(plugins={"pip_args": args}), pytest.raises(CommandError, match="could not be installed"):
        call_command("plugins", "install-deps", NEEDS_PACKAGE)
    with pytest.raises(CommandError, match="no such plugin: nope"):
        call_command("plugins", "install-deps", "nope")
