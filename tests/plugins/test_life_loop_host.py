"""A cluster worker's plugin host for the life loop (PluginHost(life_only=True), start_for_life_loop):
which plugins it starts, what it registers, and that it never fails a turn. In process, with the real
SDK in real runners; the live path through a qcluster is tests/plugins/test_life_loop_live.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from chat import events
from chat.components import LIFE, commands, registry
from chat.events import Point
from chat.models import ToolCallRecord
from plugins import host as plugin_host
from plugins.host import PluginHost
from scheduling.life import loop
from scheduling.life.loop import run_firing
from scheduling.life.timers import timer_create
from scheduling.services import SYSTEM
from tests.chat.planner_helpers import fake_llm_fixture  # noqa: F401  (the `fake_llm` fixture)
from tests.plugins.conftest import copy_plugins
from tests.scheduling.test_life import fire

pytestmark = pytest.mark.django_db(transaction=True)

DIARY = Path(__file__).resolve().parent / "life_fixtures" / "diary"


def plugins_with_diary(directory: Path, *names: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if names:
        copy_plugins(directory, *names)
    shutil.copytree(DIARY, directory / "diary", ignore=shutil.ignore_patterns("__pycache__"))
    return directory


def test_only_plugins_with_life_loop_tools_start_and_only_those_tools_register(tmp_path):
    directory = plugins_with_diary(tmp_path / "plugins", "weather", "events", "api_caller", "needs_weather")
    # A plugin with a life-loop tool brings the plugins it depends on along.
    manifest = json.loads((directory / "diary" / "_manifest.json").read_text())
    manifest["dependencies"] = [{"type": "plugin", "id": "test.maibot.weather", "version_spec": ">=1.0.0"}]
    (directory / "diary" / "_manifest.json").write_text(json.dumps(manifest))
    # One that only says the word is started (its text is all there is to go by), then stopped.
    needs = directory / "needs_weather" / "plugin.py"
    needs.write_text(needs.read_text() + "\n# declares no life_loop tool, but says the word\n")
    handlers_before = len(events.handlers(Point.RECEIVE_AFTER_PROCESS))
    host = PluginHost(life_only=True)
    try:
        host.load_all(directory)
        states = {pid: r.state for pid, r in host.records.items()}
        assert states == {
            "test.maibot.diary": "loaded",
            "test.maibot.events": "loaded",
            "test.maibot.weather": "loaded",  # the diary's dependency
        }
        stopped = [p for p in host._processes if p.plugin_id == "test.maibot.needs-weather"]
        assert stopped and all(p.discarded and p.exit_code is not None for p in stopped)
        assert registry.get("write_diary").scopes == frozenset({LIFE})
        assert registry.get("diary_note").scopes == frozenset({LIFE})  # life_loop=True: the life loop's only here
        assert registry.get("get_weather") is None and registry.get("slow_lookup") is None  # chat tools
        assert not [c for c in commands() if c.name.startswith("plugin:")]
        assert len(events.handlers(Point.RECEIVE_AFTER_PROCESS)) == handlers_before  # no chat event handlers
        notes = {c.name: c.note for c in host.records["test.maibot.events"].components if not c.registered}
        assert notes["message_counter"] == "not registered in a cluster worker (life-loop tools only)"
    finally:
        host.stop()
    assert registry.get("write_diary") is None and registry.get("diary_note") is None


@pytest.fixture
def worker_host(settings, tmp_path, monkeypatch):
    """start_for_life_loop as in a fresh worker, with this test's data dir; its host stopped after."""
    settings.DATA_DIR = str(tmp_path / "data")
    monkeypatch.setattr(plugin_host, "_life_pid", 0)
    monkeypatch.setattr(plugin_host, "life_host", None)
    yield tmp_path / "data"
    if plugin_host.life_host is not None:
        plugin_host.life_host.stop()


def evening_timer(session):
    return timer_create(spec="cron:0 8 * * *", label="evening", payload="diary", session=session, acted_by=SYSTEM)


def test_the_first_turn_starts_the_workers_host_and_is_offered_its_tools(fake_llm, worker_host, make_session):
    plugins_with_diary(worker_host / "plugins")
    fake_llm.script(fake_llm.tool_call("write_diary", {"line": "rain again"}))
    timer = evening_timer(make_session())
    assert run_firing(fire(timer).pk) == "tool"
    assert "write_diary" in {t["function"]["name"] for t in fake_llm.requests[0]["tools"]}
    record = ToolCallRecord.objects.get(name="write_diary")
    assert record.ok and record.result["result"]["content"].endswith("noted: rain again")
    first = plugin_host.life_host
    fake_llm.script(fake_llm.tool_call("do_nothing", {"reason": "quiet"}))
    assert run_firing(fire(timer).pk) == "nothing"
    assert plugin_host.life_host is first  # once per process

    # No watcher in a worker: a plugin whose folder was removed is unloaded before the next turn.
    pid = first.records["test.maibot.diary"].runner_pid
    shutil.rmtree(worker_host / "plugins" / "diary")
    fake_llm.script(fake_llm.tool_call("do_nothing", {"reason": "quiet"}))
    assert run_firing(fire(timer).pk) == "nothing"
    assert "write_diary" not in {t["function"]["name"] for t in fake_llm.requests[-1]["tools"]}
    assert first.records["test.maibot.diary"].state == "removed" and registry.get("write_diary") is None
    assert not any(p.alive for p in first._processes if p.pid == pid)


def test_a_plugin_host_that_cannot_start_never_fails_the_turn(fake_llm, worker_host, make_session, monkeypatch):
    plugins_with_diary(worker_host / "plugins")

    def broken(self, directory=None):
        raise OSError("no room for runners")

    monkeypatch.setattr(PluginHost, "load_all", broken)
    fake_llm.script(fake_llm.tool_call("do_nothing", {"reason": "quiet"}))
    timer = evening_timer(make_session())
    assert run_firing(fire(timer).pk) == "nothing"
    assert "write_diary" not in {t["function"]["name"] for t in fake_llm.requests[0]["tools"]}
    assert "plugins" in loop._turn_setups
