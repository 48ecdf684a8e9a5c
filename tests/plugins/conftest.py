"""A plugin host of the test's own, loading copies of the example plugins in tests/plugins/fixtures/
(written against the real maibot-plugin-sdk) from a temporary plugins directory."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Plugins for what crosses a runner's pipe (big frames, slow hooks): loaded by name, never by default.
IPC_FIXTURES = Path(__file__).resolve().parent / "ipc_fixtures"


def copy_plugins(target: Path, *names: str) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for name in names or [p.name for p in FIXTURES.iterdir() if p.is_dir() and not p.name.startswith("_")]:
        shutil.copytree(FIXTURES / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.fixture
def load_plugins(tmp_path) -> Iterator[Callable[..., object]]:
    """load_plugins("weather", ...) → a started PluginHost with those example plugins (all: none named);
    stopped, and its components unregistered, after the test."""
    from plugins.host import PluginHost

    hosts = []

    def load(*names: str):
        directory = copy_plugins(tmp_path / f"plugins-{len(hosts)}", *names)
        host = PluginHost()
        hosts.append(host)
        host.load_all(directory)
        return host

    yield load
    for host in hosts:
        host.stop()


def load_ipc_plugins(directory: Path, *names: str):
    """A started PluginHost with those plugins of ipc_fixtures/ copied into `directory` (the caller
    stops it)."""
    from plugins.host import PluginHost

    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(IPC_FIXTURES / name, directory / name, ignore=shutil.ignore_patterns("__pycache__"))
    host = PluginHost()
    host.load_all(directory)
    return host


# --- installing from the console (tests/plugins/test_install*.py) ----------------------------------------


@pytest.fixture
def data_dir(settings, tmp_path):
    """A data dir of the test's own, with its empty plugins folder."""
    settings.DATA_DIR = tmp_path / "data"
    (tmp_path / "data" / "plugins").mkdir(parents=True)
    return tmp_path / "data"


@pytest.fixture
def installer(client):
    """A logged-in client of staff who may view the console and install plugins."""
    from tests.plugins.install_helpers import staff

    client.force_login(staff("maibot.view_console", "plugins.install_plugin"))
    return client


@contextmanager
def host_on(folder: Path, monkeypatch) -> Iterator[object]:
    """The server's plugin host (plugins.host.host) loaded from `folder`, without a watcher (hot reload
    off: an install or update loads the plugin itself, as Rescan does); stopped after."""
    from plugins import host as plugin_host

    host = plugin_host.PluginHost()
    host.load_all(folder)
    monkeypatch.setattr(plugin_host, "host", host)
    try:
        yield host
    finally:
        host.stop()
