"""Plugin code runs in runner subprocesses: a plugin that exits its process, blocks its loop, exhausts its
memory or never answers costs one error result, never the host, another plugin or the planner cycle; a
crashed runner comes back (with backoff, a bounded number of times). Hot reload of code and config
(a failed reload keeps the running version), the generated config.toml, allow_hot_reload = false; a
plugin whose folder is removed is unloaded within seconds, and one put back (or renamed) loads again."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from django.contrib.auth.models import User

from chat.agent.engine import AgentTurn
from chat.agent.llm import ToolCallRequest
from chat.components import commands, registry
from chat.models import CycleKind
from core import config
from plugins import host as plugin_host
from plugins.host import PluginHost, PluginState, PluginWatcher
from tests.conftest import wait_for
from tests.plugins.conftest import FIXTURES, copy_plugins

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

UNRULY = "test.maibot.unruly"
WEATHER = "test.maibot.weather"
FAST_RESTARTS = {"cancel_grace": 1.0, "restart_backoff_seconds": 0.05, "runner_memory_mb": 512}


def call(turn: AgentTurn, name: str, arguments: dict | None = None) -> dict:
    arguments = arguments or {}
    request = ToolCallRequest(id=f"call_{name}", name=name, raw_arguments=json.dumps(arguments), arguments=arguments)
    return turn.execute([request])[0].result


def status(host) -> dict:
    record = host.records[UNRULY]
    component = next(c for c in record.components if c.name == "unruly_status")
    return host.invoke(record, component, {}, 20)


def running_again(record, not_pid: int) -> bool:
    return record.runner_state == "running" and record.runner_pid not in (None, not_pid)


def test_a_plugin_that_crashes_blocks_leaks_or_hangs_costs_one_error_result_and_its_runner_comes_back(
    load_plugins, make_session, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("MAIBOT_ADAPTER_TOKENS", "secret-token")
    with config.override(chat={"tool_timeout": 2.0}, plugins=FAST_RESTARTS):
        host = load_plugins("weather", "unruly")
        record = host.records[UNRULY]
        turn = AgentTurn.open(kind=CycleKind.CHAT, session=make_session(), trigger="test")
        first_status = call(turn, "unruly_status")["result"]
        first = record.runner_pid
        assert first not in (None, os.getpid()) and first_status["pid"] != os.getpid()
        assert first_status["secrets_seen"] == []  # the runner's environment holds none of the bot's secrets

        crashed = call(turn, "unruly_crash")
        assert crashed["error"]["code"] == "tool_failed"
        assert "exited (code 3)" in crashed["error"]["message"]
        # The other plugin and the cycle go on.
        assert call(turn, "get_weather", {"city": "Paris"})["result"]["content"] == "麦麦: light rain, 14°C"
        assert wait_for(lambda: running_again(record, first), timeout=30), record.recent_errors
        assert record.restarts == 1 and record.state == PluginState.LOADED
        assert any("exited with code 3; restarting" in e for e in record.recent_errors)
        second = record.runner_pid
        assert call(turn, "unruly_status")["result"]["boot"] != first_status["boot"]  # a new runner answers

        # Blocking the runner's loop: the call times out, the runner cannot confirm the cancellation,
        # so it is killed and restarted.
        assert call(turn, "unruly_block")["error"]["code"] == "tool_timeout"
        assert wait_for(lambda: running_again(record, second), timeout=30), record.recent_errors
        assert any("blocked its runner; the runner was killed" in e for e in record.recent_errors)
        third = record.runner_pid
        third_boot = call(turn, "unruly_status")["result"]["boot"]

        # Awaiting forever: cancelled in the runner, which stays.
        assert call(turn, "unruly_hang")["error"]["code"] == "tool_timeout"
        # Memory past the runner's limit: MemoryError in the plugin, the runner stays.
        leaked = call(turn, "unruly_leak")
        assert leaked["error"] == {"code": "tool_failed", "message": "MemoryError: "}
        assert record.refusals == {"memory": 1} and "runner_memory_mb = 512" in record.last_refusal
        assert call(turn, "unruly_status")["result"]["boot"] == third_boot and third == record.runner_pid
        assert record.restarts == 2
        weather = host.records["test.maibot.weather"]
        assert weather.runner_state == "running" and weather.restarts == 0


def test_a_runner_crashing_too_often_is_left_failed_until_reloaded(load_plugins, make_session):
    with config.override(plugins={**FAST_RESTARTS, "max_restarts": 0}):
        host = load_plugins("unruly")
        record = host.records[UNRULY]
        turn = AgentTurn.open(kind=CycleKind.CHAT, session=make_session(), trigger="test")
        assert call(turn, "unruly_crash")["error"]["code"] == "tool_failed"
        assert wait_for(lambda: record.state == PluginState.FAILED, timeout=20)
        assert record.reason.endswith("1 crashes within 600s, not restarted (reload to retry)")
        assert record.runner_state == "crashed" and registry.get("unruly_status") is None

        outcome = host.reload(UNRULY)
        assert outcome.ok and record.state == PluginState.LOADED
        assert registry.get("unruly_status") is not None and status(host)["version"] == "1"


def test_hot_reload_of_code_and_config_and_a_failed_reload_keeps_the_running_version(load_plugins):
    host = load_plugins("unruly")
    record = host.records[UNRULY]
    folder = record.folder
    # config.toml was generated from the config_model on first load.
    generated = (folder / "config.toml").read_text()
    assert '[mood]\nword = "calm"' in generated and status(host)["mood"] == "calm"
    watcher = PluginWatcher(host, host.directory, debounce_ms=50).start()
    try:
        source = (folder / "plugin.py").read_text()
        (folder / "plugin.py").write_text(source.replace('VERSION = "1"', 'VERSION = "2"'))
        assert wait_for(lambda: status(host)["version"] == "2", timeout=30), record.reload_error

        (folder / "plugin.py").write_text(source + "\nthis is not python (\n")
        assert wait_for(lambda: "SyntaxError" in record.reload_error, timeout=30), record.recent_errors
        assert "hot reload (plugin.py)" in record.reload_error
        assert record.state == PluginState.LOADED and status(host)["version"] == "2"  # the old one runs on

        (folder / "plugin.py").write_text(source.replace('VERSION = "1"', 'VERSION = "3"'))
        assert wait_for(lambda: status(host)["version"] == "3", timeout=30), record.reload_error
        assert record.reload_error == ""

        (folder / "config.toml").write_text(generated.replace('"calm"', '"stormy"'))
        assert wait_for(lambda: status(host)["mood"] == "stormy", timeout=30), record.reload_error
        assert record.config["mood"]["word"] == "stormy"

        (folder / "config.toml").write_text(generated.replace('"calm"', "[1]"))
        assert wait_for(lambda: "mood.word" in record.reload_error, timeout=30), record.recent_errors
        assert status(host)["mood"] == "stormy"
    finally:
        watcher.stop()


def test_a_plugin_that_forbids_hot_reload_is_left_alone_until_reloaded_by_hand(load_plugins):
    host = load_plugins("unruly")
    record = host.records[UNRULY]
    path, config_path = record.folder / "plugin.py", record.folder / "config.toml"
    source, generated = path.read_text(), config_path.read_text()
    # In its config.toml (kept even though its config_model does not declare the key)…
    forbidding = generated.replace("enabled = true", "enabled = true\nallow_hot_reload = false")
    assert host.validate_config(UNRULY, forbidding).ok and not record.allow_hot_reload
    path.write_text(source.replace('VERSION = "1"', 'VERSION = "2"'))
    watcher = PluginWatcher(host, host.directory, debounce_ms=50)
    # What the watcher does with the change (called directly: no waiting on the file system here).
    assert watcher.handle({path}) == []
    assert "allow_hot_reload = false" in record.reload_error and status(host)["version"] == "1"
    assert host.reload(UNRULY, source="reload").ok and status(host)["version"] == "2"
    # … or as a class attribute of the plugin (the design note's `allow_hot_reload: bool`).
    config_path.write_text(generated)
    path.write_text(
        source.replace(
            "    config_model = UnrulyConfig", "    config_model = UnrulyConfig\n    allow_hot_reload = False"
        )
    )
    assert host.reload(UNRULY).ok and not record.allow_hot_reload
    assert watcher.handle({path}) == [] and record.state == PluginState.LOADED


def test_an_edited_plugin_config_is_validated_by_its_model_and_written_only_when_valid(load_plugins):
    host = load_plugins("unruly")
    record = host.records[UNRULY]
    path = record.folder / "config.toml"
    before = path.read_text()
    bad = host.validate_config(UNRULY, before.replace('"calm"', "[1]"))
    assert not bad.ok and "mood.word" in bad.message
    assert path.read_text() == before and status(host)["mood"] == "calm"
    assert not host.validate_config(UNRULY, "[mood\n").ok and path.read_text() == before

    good = host.validate_config(UNRULY, before.replace('"calm"', '"sunny"'))
    assert good.ok and path.read_text() == before.replace('"calm"', '"sunny"')
    assert status(host)["mood"] == "sunny"

    assert host.set_enabled(UNRULY, False).ok
    assert record.state == PluginState.DISABLED and registry.get("unruly_status") is None
    assert "enabled = false" in path.read_text()
    assert host.set_enabled(UNRULY, True).ok and status(host)["mood"] == "sunny"


def test_the_watcher_follows_code_and_config_but_not_the_data_a_plugin_writes_into_its_folder(tmp_path):
    from plugins.host import PluginHost

    watcher = PluginWatcher(PluginHost(), tmp_path, debounce_ms=50)
    relevant = [
        "weather",
        "weather/plugin.py",
        "weather/lib/helpers.py",
        "weather/config.toml",
        "weather/_manifest.json",
    ]
    ignored = [
        "weather/data/cache.json",
        "weather/state.json",
        "weather/data/config.toml",
        "weather/__pycache__/plugin.cpython-311.pyc",
        "weather/.config.toml.tmp",
    ]
    assert [p for p in relevant if not watcher._is_relevant(None, str(tmp_path / p))] == []
    assert [p for p in ignored if watcher._is_relevant(None, str(tmp_path / p))] == []


def test_a_reload_compiles_the_plugin_from_source_even_when_size_and_mtime_did_not_change(load_plugins):
    host = load_plugins("unruly")
    path = host.records[UNRULY].folder / "plugin.py"
    source = path.read_text()
    path.write_text(source.replace('VERSION = "1"', 'VERSION = "2"'))
    assert host.reload(UNRULY).ok and status(host)["version"] == "2"
    stat = path.stat()
    path.write_text(source.replace('VERSION = "1"', 'VERSION = "3"'))  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime: a stale .pyc would look valid
    assert host.reload(UNRULY).ok and status(host)["version"] == "3"
    assert not (path.parent / "__pycache__").exists()  # nothing cached in the plugin's folder


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def weather_registered() -> bool:
    return registry.get("get_weather") is not None or any(c.name.startswith(f"plugin:{WEATHER}:") for c in commands())


def test_a_removed_plugin_folder_unloads_its_plugin_and_one_put_back_or_renamed_loads_again(
    tmp_path, client, monkeypatch
):
    directory = copy_plugins(tmp_path / "plugins", "weather")
    host = PluginHost()
    host.load_all(directory)
    host.watcher = PluginWatcher(host, directory, debounce_ms=50).start()
    monkeypatch.setattr(plugin_host, "host", host)
    try:
        record = host.records[WEATHER]
        pid = record.runner_pid
        assert pid and weather_registered()

        shutil.rmtree(directory / "weather")
        # Its command, tools and runner go within seconds (the watcher's debounce, then on_unload).
        assert wait_for(lambda: record.state == PluginState.REMOVED, timeout=10), record.recent_errors
        assert not weather_registered()
        assert wait_for(lambda: process_gone(pid), timeout=15)
        assert record.reason.startswith(f"its folder weather/ was removed from {directory}; unloaded at ")
        assert record.process is None and record.runner_state == "stopped" and record.restarts == 0
        # Every operator action says why (not "no _manifest.json"); the admin offers none and says it.
        for outcome in (host.reload(WEATHER), host.set_enabled(WEATHER, True), host.validate_config(WEATHER, "")):
            assert outcome == plugin_host.ReloadOutcome(False, record.reason)
        client.force_login(User.objects.create_superuser("root", password="pw"))
        page = client.get("/admin/plugins/").content.decode()
        assert "removed" in page and "its folder weather/ was removed" in page
        assert f"/admin/plugins/{WEATHER}/reload/" not in page
        assert client.get(f"/admin/plugins/{WEATHER}/config/").status_code == 404

        shutil.copytree(FIXTURES / "weather", directory / "weather-again")
        assert wait_for(lambda: host.records[WEATHER].state == PluginState.LOADED, timeout=30)
        again = host.records[WEATHER]
        assert again.folder == directory / "weather-again" and weather_registered()

        first_pid = again.runner_pid
        (directory / "weather-again").rename(directory / "weather-renamed")  # a removal and an addition
        assert wait_for(lambda: host.records[WEATHER].folder.name == "weather-renamed", timeout=30)
        assert wait_for(lambda: host.records[WEATHER].state == PluginState.LOADED, timeout=30)
        assert weather_registered() and wait_for(lambda: process_gone(first_pid), timeout=15)
    finally:
        host.stop()


def test_a_removed_folder_unloads_its_plugin_also_without_hot_reload(tmp_path):
    directory = copy_plugins(tmp_path / "plugins", "weather")
    host = PluginHost()
    host.load_all(directory)
    host.watcher = PluginWatcher(host, directory, debounce_ms=50, hot_reload=False).start()
    try:
        pid = host.records[WEATHER].runner_pid
        shutil.rmtree(directory / "weather")
        assert wait_for(lambda: host.records[WEATHER].state == PluginState.REMOVED, timeout=10)
        assert not weather_registered() and wait_for(lambda: process_gone(pid), timeout=15)
    finally:
        host.stop()


def test_the_plugins_folder_is_created_at_start_and_a_plugin_put_there_later_loads(tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    # This process's host, if an earlier in-process test started one through the ASGI app, is not ours.
    plugin_host.stop()
    with config.override(plugins={"reload_debounce_ms": 50}):
        host = plugin_host.start()
        try:
            assert (settings.DATA_DIR / "plugins").is_dir()
            shutil.copytree(FIXTURES / "weather", settings.DATA_DIR / "plugins" / "weather")
            assert wait_for(lambda: WEATHER in host.records and host.records[WEATHER].state == "loaded", timeout=30)
            assert weather_registered()
        finally:
            plugin_host.stop()
