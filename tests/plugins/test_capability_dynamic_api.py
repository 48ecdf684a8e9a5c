"""api.replace_dynamic with a plugin in its own runner (tests/plugins/capability_fixtures/dynapi, written
against the real maibot-plugin-sdk): the APIs it declares at run time are callable by others through
api.call and answered by the SDK's own dispatch; a new declaration takes the dropped ones offline, a
static API cannot be replaced, and a reload forgets them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from plugins import host as hosts
from plugins.host import PluginHost, PluginState
from tests.plugins.sdk_context import plugin

pytestmark = pytest.mark.django_db(transaction=True)

DYNAPI = "test.maibot.dynapi"
FIXTURE = Path(__file__).resolve().parent / "capability_fixtures" / "dynapi"


@pytest.fixture
def dynapi(tmp_path, settings, monkeypatch):
    settings.DATA_DIR = tmp_path
    directory = tmp_path / "plugins"
    shutil.copytree(FIXTURE, directory / "dynapi", ignore=shutil.ignore_patterns("__pycache__"))
    host = PluginHost()
    monkeypatch.setattr(hosts, "host", host)
    host.load_all(directory)
    assert host.records[DYNAPI].state == PluginState.LOADED, host.records[DYNAPI].reason
    yield host
    host.stop()


def test_dynamic_apis_are_callable_replaced_and_forgotten_on_reload(dynapi):
    host = dynapi
    _, ctx = plugin("test.core.caller", ["api.call", "api.list"])

    def call(name: str, **kwargs):
        return host.run(ctx.api.call(f"{DYNAPI}.{name}", **kwargs), 30)

    assert call("publish", words=["hello", "world"]) is True
    assert call("hello", text="hi") == "HELLO: hi" and call("world", text="你好") == "WORLD: 你好"
    names = {a["name"] for a in host.run(ctx.api.list(plugin_id=DYNAPI), 10)}
    assert names == {"publish", "steal", "hello", "world"}

    assert call("publish", words=["hello"]) is True
    gone = call("world", text="x")
    assert gone["success"] is False and f"no API {DYNAPI}.world" in gone["error"]
    stolen = call("steal")
    assert stolen["success"] is False and "动态 API 不能覆盖静态 API" in stolen["error"]
    assert call("publish", text="still the static one") is True  # words=(): none dynamic now

    assert call("publish", words=["again"]) is True
    assert host.reload(DYNAPI).ok
    assert call("again", text="x")["success"] is False  # the new runner has declared none
