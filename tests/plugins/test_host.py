"""The plugin host in-process, with example plugins written against the real maibot-plugin-sdk: why each
broken plugin is refused (the others load), tools and actions run as planner tools through the
agent-turn engine (recorded, timed out, failing as error results), commands intercept before the
planner, the capabilities answer with our data (or say they are not supported), the admin page."""

from __future__ import annotations

import json
import os
import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Permission, User

from chat.agent.engine import AgentTurn
from chat.agent.llm import ToolCallRequest
from chat.commands import run_commands
from chat.components import commands, registry
from chat.models import CycleKind, Direction, LLMCall, Message, ToolCallRecord
from core import config
from plugins import host as plugin_host
from plugins import manifest as mf
from plugins.host import PluginState
from tests.chat.planner_helpers import inbound_store
from tests.fake_llm import FakeLLM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

WEATHER = "test.maibot.weather"


def call(turn: AgentTurn, name: str, arguments: dict) -> dict:
    request = ToolCallRequest(id=f"call_{name}", name=name, raw_arguments=json.dumps(arguments), arguments=arguments)
    return turn.execute([request])[0].result


def test_each_broken_plugin_is_refused_with_its_reason_and_the_others_load(load_plugins):
    host = load_plugins()
    states = {pid: (r.state, r.reason) for pid, r in host.records.items()}
    assert states[WEATHER] == (PluginState.LOADED, "")
    # Loaded after the plugin it depends on.
    assert states["test.maibot.needs-weather"] == (PluginState.LOADED, "")
    assert states["test.maibot.future"] == (
        PluginState.REFUSED,
        "host_application needs MaiBot >= 2.0.0; this host is compatible with MaiBot 1.2.1",
    )
    assert states["test.maibot.needs-package"] == (
        PluginState.REFUSED,
        "missing Python dependencies: maibot-test-missing-package>=1.0 (not installed)",
    )
    assert states["test.maibot.needs-plugin"] == (
        PluginState.REFUSED,
        "depends on plugin test.maibot.absent>=1.0.0, but it is not installed",
    )
    assert states["test.maibot.cycle-a"] == (
        PluginState.REFUSED,
        "dependency cycle: test.maibot.cycle-a -> test.maibot.cycle-b -> test.maibot.cycle-a",
    )
    assert states["test.maibot.cycle-b"][0] == PluginState.REFUSED
    assert "dependency cycle" in states["test.maibot.cycle-b"][1]
    assert states["test.maibot.raises"] == (
        PluginState.FAILED,
        "ImportError: this plugin needs a module that is not there",
    )
    weather = host.records[WEATHER]
    kinds = {c.name: (c.kind, c.registered) for c in weather.components}
    assert kinds["get_weather"] == ("TOOL", True) and kinds["wave"] == ("ACTION", True)
    assert kinds["hello"] == ("COMMAND", True)
    assert weather.unsupported_capabilities == ["send.video"]
    assert weather.config["hello"]["greeting"] == "Hi"  # its config.toml, validated by its config_model
    assert weather.runner_pid and weather.runner_pid != os.getpid()  # its code runs in a runner of its own
    assert registry.get("get_weather") is not None
    host.stop()
    assert registry.get("get_weather") is None
    assert not [c for c in commands() if c.name.startswith("plugin:")]


def test_a_plugin_disabled_in_its_config_is_not_loaded_nor_are_its_dependents(load_plugins, tmp_path):
    from tests.plugins.conftest import copy_plugins

    directory = copy_plugins(tmp_path / "disabled", "weather", "needs_weather")
    config = directory / "weather" / "config.toml"
    config.write_text(config.read_text().replace("enabled = true", "enabled = false"))
    host = plugin_host.PluginHost()
    try:
        host.load_all(directory)
        weather = host.records[WEATHER]
        assert (weather.state, weather.reason) == (
            PluginState.DISABLED,
            "disabled in its config.toml ([plugin] enabled = false)",
        )
        assert registry.get("get_weather") is None
        assert host.records["test.maibot.needs-weather"].reason == (
            "depends on plugin test.maibot.weather, which is disabled"
        )
    finally:
        host.stop()


def test_an_invalid_plugin_config_fails_the_plugin_with_the_reason(tmp_path):
    from tests.plugins.conftest import copy_plugins

    directory = copy_plugins(tmp_path / "bad-config", "weather")
    bad = '[plugin]\nconfig_version = "1.0.0"\n[hello]\ngreeting = [1]\n'
    (directory / "weather" / "config.toml").write_text(bad)
    host = plugin_host.PluginHost()
    try:
        host.load_all(directory)
        weather = host.records[WEATHER]
        assert weather.state == PluginState.FAILED
        assert weather.reason.startswith("ValidationError:") and "hello.greeting" in weather.reason
        assert registry.get("get_weather") is None
    finally:
        host.stop()


def test_in_offline_mode_a_plugin_command_answers_without_the_offline_notice(load_plugins, make_session):
    from chat.offline import run_offline_cycle

    load_plugins("weather")
    session = make_session()
    hello = inbound_store(session=session, text="/hello Carol")
    cycle = async_to_sync(run_offline_cycle)(session=session, new_messages=[hello], mentioned=False)
    assert cycle.action == "command"
    assert list(Message.objects.filter(direction=Direction.OUT).values_list("text", flat=True)) == ["Hi, Carol!"]


def _plugin_folder(tmp_path, manifest, plugin="from maibot_sdk import MaiBotPlugin\n"):
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "_manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    (folder / "plugin.py").write_text(plugin)
    return folder


GOOD = {
    "manifest_version": 2,
    "id": "a.b",
    "version": "1.0.0",
    "name": "n",
    "host_application": {"min_version": "1.0.0", "max_version": "1.0.0"},
    "sdk": {"min_version": "2.0.0", "max_version": "2.99.99"},
}


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ("{not json", "_manifest.json is not valid JSON"),
        ("[1]", "_manifest.json must hold a JSON object"),
        ({**GOOD, "manifest_version": 1}, "manifest_version 1 (legacy plugin system) is not supported by this host"),
        ({**GOOD, "id": "nodots"}, "_manifest.json: id: must be letters/digits/underscores separated by dots"),
        ({**GOOD, "version": "1.0"}, "_manifest.json: version: must be a strict X.Y.Z version"),
        (
            {**GOOD, "host_application": {"min_version": "1.2.0", "max_version": "1.0.0"}},
            "_manifest.json: host_application: min_version is greater than max_version",
        ),
        ({k: v for k, v in GOOD.items() if k != "sdk"}, "_manifest.json: sdk: Field required"),
        (
            {**GOOD, "dependencies": [{"type": "plugin", "id": "x.y", "version_spec": ">>1"}]},
            "_manifest.json: dependencies.0.plugin.version_spec: invalid version specifier",
        ),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_problem(tmp_path, manifest, reason):
    with pytest.raises(mf.ManifestError) as exc:
        mf.read_manifest(_plugin_folder(tmp_path, manifest))
    assert str(exc.value).startswith(reason)


def test_host_range_is_checked_as_maibot_does_with_its_patch_compatibility_mode():
    manifest = mf.Manifest.model_validate(GOOD)
    assert mf.check_compatibility(manifest, host_version="1.0.0") == []
    warnings = mf.check_compatibility(manifest, host_version="1.0.7")
    assert warnings and "compatibility mode" in warnings[0]
    with pytest.raises(mf.ManifestError, match=re.escape("allows MaiBot up to 1.0.0")):
        mf.check_compatibility(manifest, host_version="1.1.0")
    with pytest.raises(mf.ManifestError, match=re.escape("sdk range 3.0.0–3.1.0 does not contain the installed")):
        mf.check_compatibility(
            mf.Manifest.model_validate({**GOOD, "sdk": {"min_version": "3.0.0", "max_version": "3.1.0"}}),
            host_version="1.0.0",
        )


def test_plugin_tools_run_as_planner_tools_recorded_like_built_ins(load_plugins, make_session):
    host = load_plugins("weather")
    session = make_session()
    inbound_store(session=session, text="what's the weather in Paris?")
    turn = AgentTurn.open(kind=CycleKind.CHAT, session=session, trigger="test")
    assert "get_weather" in [t["function"]["name"] for t in turn.schemas()]

    result = call(turn, "get_weather", {"city": "Paris"})
    assert result == {
        "ok": True,
        "result": {
            "content": "麦麦: light rain, 14°C",
            "stream_seen": True,
            "recent_texts": ["what's the weather in Paris?"],
        },
    }
    record = ToolCallRecord.objects.get(cycle=turn.cycle, name="get_weather")
    assert record.ok and record.arguments == {"city": "Paris"} and record.result == result

    failed = call(turn, "failing_tool", {})
    assert failed["error"] == {"code": "tool_failed", "message": "ValueError: the weather station is down"}
    unsupported = call(turn, "send_video", {})
    assert unsupported["result"]["content"] == "no video: capability send.video is not supported by this host"
    undeclared = call(turn, "undeclared", {})
    assert undeclared["error"]["message"] == (
        "RuntimeError: capability person.get_id is not declared in plugin test.maibot.weather's manifest"
    )
    assert host.records[WEATHER].errors >= 2


def test_a_plugin_tool_past_its_timeout_is_an_error_result_and_the_host_keeps_serving(load_plugins, make_session):
    load_plugins("weather")
    session = make_session()
    turn = AgentTurn.open(kind=CycleKind.CHAT, session=session, trigger="test")
    with config.override(chat={"tool_timeout": 0.5}):
        result = call(turn, "slow_tool", {})
    assert result["error"]["code"] == "tool_timeout"
    assert call(turn, "get_weather", {"city": "Beijing"})["result"]["content"] == "麦麦: sunny, 22°C"


def test_an_action_gets_its_action_data_and_sends_through_the_send_service(load_plugins, make_session):
    load_plugins("weather")
    session = make_session()
    turn = AgentTurn.open(kind=CycleKind.CHAT, session=session, trigger="test")
    assert call(turn, "wave", {"target": "Bob"}) == {"ok": True, "result": {"content": "(True, 'waved')"}}
    sent = Message.objects.get(session=session, direction=Direction.OUT)
    assert sent.text == "*waves at Bob*" and sent.delivery_status == "pending"
    assert sent.extra == {"plugin": WEATHER, "capability": "send.text"}


def test_a_command_intercepts_before_the_planner_and_one_that_does_not_lets_the_message_through(
    load_plugins, make_session
):
    load_plugins("weather")
    session = make_session()
    hello = inbound_store(session=session, text="/hello Bob")
    peek = inbound_store(session=session, text="/peek at this")
    chatter = inbound_store(session=session, text="just chatting")

    handled, cycle = async_to_sync(run_commands)(session=session, new_messages=[hello, peek, chatter])
    assert handled == {hello.pk}
    assert cycle.action == "command"
    assert "plugin command test.maibot.weather.hello: ok (greeted Bob)" in cycle.outcome
    assert "plugin command test.maibot.weather.peek: ok (peeked)" in cycle.outcome
    assert list(Message.objects.filter(direction=Direction.OUT).values_list("text", flat=True)) == ["Hi, Bob!"]

    handled, cycle = async_to_sync(run_commands)(session=session, new_messages=[chatter])
    assert handled == set() and cycle is None  # nothing matched: no turn opened


def test_capabilities_answer_with_our_sessions_and_messages(load_plugins, make_session):
    host = load_plugins("weather")
    ctx = host.records[WEATHER].context
    private = make_session(user_id="4242")
    group = make_session("group", group_id="777")
    said = inbound_store(session=private, text="hello there", platform_message_id="pm-1")

    stream = host.run(ctx.chat.get_stream_by_user_id("4242"), 10)
    assert stream["stream_id"] == private.session_id and stream["chat_type"] == "private"
    assert host.run(ctx.chat.get_stream_by_group_id("777"), 10)["stream_id"] == group.session_id
    assert host.run(ctx.chat.get_stream_by_group_id("nope"), 10) is None
    streams = host.run(ctx.chat.get_all_streams(), 10)
    assert {s["stream_id"] for s in streams} == {private.session_id, group.session_id}

    found = host.run(ctx.message.get_by_id("pm-1", stream_id=private.session_id), 10)
    assert found["processed_plain_text"] == "hello there"
    assert found["message_info"]["user_info"]["user_id"] == said.sender_id
    assert host.run(ctx.config.get("bot.nickname"), 10) == "麦麦"
    assert host.run(ctx.config.get("chat.no_such_key", "fallback"), 10) == "fallback"
    assert host.run(ctx.config.get("llm.api_key_env", "hidden"), 10) == "hidden"
    assert host.run(ctx.send.text("hi", "no-such-stream"), 10) is False
    assert host.run(ctx.send.text("", private.session_id), 10) is False
    assert host.run(ctx.send.text("hi", private.session_id), 10) is True


def test_llm_generate_goes_through_our_client_and_ledger(load_plugins, make_session):
    load_plugins("weather")
    session = make_session()
    inbound_store(session=session, text="we talked about rain")
    with (
        FakeLLM() as fake,
        config.override(llm={"base_url": fake.base_url, "model": "fake-model", "max_retries": 0}),
    ):
        fake.script(fake.text("You talked about rain."))
        turn = AgentTurn.open(kind=CycleKind.CHAT, session=session, trigger="test")
        result = call(turn, "summarize_chat", {})
        assert result == {"ok": True, "result": {"content": "You talked about rain.", "success": True}}
        assert "we talked about rain" in fake.requests[0]["messages"][0]["content"]
    ledger = LLMCall.objects.get()
    assert ledger.purpose == "plugin:test.maibot.weather" and ledger.task == "utility"


def test_admin_plugins_page_lists_states_reasons_and_unanswered_capabilities(load_plugins, client, monkeypatch):
    host = load_plugins()
    monkeypatch.setattr(plugin_host, "host", host)
    staff = User.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get("/admin/plugins/").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_console"))
    page = client.get("/admin/plugins/").content.decode()
    assert "dependency cycle: test.maibot.cycle-a -&gt; test.maibot.cycle-b -&gt; test.maibot.cycle-a" in page
    assert "host_application needs MaiBot &gt;= 2.0.0" in page
    assert "ImportError: this plugin needs a module that is not there" in page
    assert "send.video" in page and "ACTION <code>wave</code>" in page
    assert "test.maibot.unruly" in page and "running, pid" in page
    assert 'name="action"' not in page  # a viewer is offered no action

    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    page = client.get("/admin/plugins/").content.decode()
    assert (
        f'action="/admin/plugins/{WEATHER}/reload/"' in page and f'action="/admin/plugins/{WEATHER}/disable/"' in page
    )
    assert f'href="/admin/plugins/{WEATHER}/config/"' in page
    assert 'action="/admin/plugins/test.maibot.needs-package/install-deps/"' in page
