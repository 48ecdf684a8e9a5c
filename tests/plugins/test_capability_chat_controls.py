"""message.count_new, frequency.*, tool.get_definitions and component.* (plugin lists, reload) through the
real maibot-plugin-sdk's PluginContext, in MaiBot 1.3's shapes; a plugin reloads only itself, not too
often, and one that did not declare a capability is refused."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from chat import talk
from chat.models import Message
from plugins import host as hosts
from plugins.capabilities import components
from tests.chat.planner_helpers import inbound_store
from tests.conftest import wait_for
from tests.plugins.sdk_context import plugin, run

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = "test.maibot.weather"


def test_count_new_counts_a_chats_messages_after_a_time(make_session):
    session, other = make_session(), make_session()
    now = datetime.now(UTC)
    for minutes in (90, 30, 10):
        m = inbound_store(session=session, text=f"{minutes} min ago")
        Message.objects.filter(pk=m.pk).update(time=now - timedelta(minutes=minutes))
    inbound_store(session=other, text="elsewhere")
    _, ctx = plugin("test.core.counter", ["message.count_new"])
    sid = session.session_id

    assert run(ctx.message.count_new(sid, str((now - timedelta(hours=1)).timestamp()))) == 2
    assert run(ctx.message.count_new(sid, (now - timedelta(hours=2)).isoformat())) == 3
    since = (now - timedelta(minutes=30)).timestamp()  # exclusive, as MaiBot's after_time
    assert run(ctx.message.count_new(sid, since)) == 1
    window = ctx.call_capability("message.count_new", chat_id=sid, start_time=0, end_time=since)
    assert run(window) == 2
    assert run(ctx.message.count_new("no-such-chat", 0)) == 0
    bad = run(ctx.message.count_new(sid, "yesterday"))
    assert bad["success"] is False and "neither a Unix timestamp" in bad["error"]


def test_frequency_adjust_scales_the_talk_frequency_the_planner_uses(make_session):
    group = make_session(chat_type="group")
    _, ctx = plugin(
        "test.core.quiet", ["frequency.set_adjust", "frequency.get_adjust", "frequency.get_current_talk_value"]
    )
    sid = group.session_id
    try:
        assert run(ctx.frequency.get_adjust(sid)) == 1.0
        assert run(ctx.frequency.get_current_talk_value(sid)) == 0.5  # chat.talk_frequency's default
        assert run(ctx.frequency.set_adjust(sid, 0.2)) is True
        assert run(ctx.frequency.get_adjust(sid)) == 0.2
        assert talk.talk_frequency(group) == pytest.approx(0.1)  # what the planner's group bar reads
        assert run(ctx.frequency.set_adjust(sid, -3)) is True and talk.talk_frequency(group) == 0.0  # as MaiBot
        assert run(ctx.frequency.set_adjust(sid, float("inf"))) is False
        assert run(ctx.frequency.set_adjust("no-such-chat", 0.5)) is False
        assert run(ctx.frequency.set_adjust(sid, 1)) is True and talk.talk_adjust(sid) == 1.0
    finally:
        talk.talk_adjust_set(sid, 1.0)


def test_tools_and_plugins_are_listed_as_maibot_lists_them(load_plugins, monkeypatch):
    host = load_plugins("weather")
    monkeypatch.setattr(hosts, "host", host)
    caps = ["tool.get_definitions", "component.get_all_plugins", "component.get_plugin_info"]
    more = ["component.get_plugin_config_schema", "component.load_plugin", "component.unload_plugin"]
    _, ctx = plugin(
        "test.core.lister", [*caps, *more, "component.list_loaded_plugins", "component.update_plugin_config"]
    )

    tools = {t["name"]: t["definition"] for t in run(ctx.tool.get_definitions())}
    weather = tools["get_weather"]
    assert weather["name"] == "get_weather" and weather["description"]
    assert weather["parameters_schema"]["type"] == "object" and "city" in weather["parameters_schema"]["properties"]
    assert run(ctx.component.list_loaded_plugins()) == [WEATHER]
    plugins = run(ctx.component.get_all_plugins())
    assert plugins[WEATHER]["version"] == "1.2.0" and plugins[WEATHER]["enabled"] is True
    listed = {c["name"]: c for c in plugins[WEATHER]["components"]}
    assert listed["get_weather"]["type"] == "TOOL" and listed["get_weather"]["enabled"] is True
    info = run(ctx.component.get_plugin_info(WEATHER))
    assert info["name"] == WEATHER and info["default_config"]["hello"] == {"greeting": "Hello"}
    schema = run(ctx.component.get_plugin_config_schema(WEATHER))
    assert schema["plugin_id"] == WEATHER and schema["default_config"] == info["default_config"]
    assert "hello" in str(schema["schema"]) and schema["schema"] == info["config_schema"]
    assert run(ctx.component.load_plugin(WEATHER)) == {"success": True, "count": 1}
    assert run(ctx.component.load_plugin("no.such.plugin"))["success"] is False
    assert run(ctx.component.unload_plugin(WEATHER)) == {
        "success": False,
        "error": "新运行时不支持单独卸载插件，请使用 reload",
    }
    refused = run(
        ctx.call_capability("component.update_plugin_config", plugin_name=WEATHER, key="hello.greeting", value="x")
    )
    assert refused == {"success": False, "error": "仅插件管理内置插件可以修改插件配置"}
    missing = run(ctx.component.get_plugin_info("no.such.plugin"))
    assert missing == {"success": False, "error": "未找到插件: no.such.plugin"}
    with pytest.raises(RuntimeError, match=re.escape("component.reload_plugin is not declared")):
        run(ctx.component.reload_plugin(WEATHER))


def test_a_plugin_reloads_itself_not_another_and_not_in_a_loop(load_plugins, monkeypatch):
    host = load_plugins("weather")
    monkeypatch.setattr(hosts, "host", host)
    monkeypatch.setattr(components, "_self_reloads", {})
    record = host.records[WEATHER]
    _, other = plugin("test.core.other", ["component.reload_plugin"])
    refused = run(other.component.reload_plugin(WEATHER))
    assert refused["success"] is False and "may reload only itself" in refused["error"]

    before = (record.reloaded_at, record.runner_pid)
    assert run(components.reload_plugin(record, {"plugin_name": WEATHER})) == {"success": True}
    assert wait_for(lambda: record.runner_pid not in (None, before[1]), timeout=60)
    again = run(components.reload_plugin(record, {"plugin_name": WEATHER}))
    assert again["success"] is False and "reloaded less than 30 s ago" in again["error"]
