"""Every capability MaiBot 1.3.15's host registers is answered here; and those MaiBot 1.2's host answers
that plugins of the public index declare, answered with the same arguments and results:
message.get_by_time (every chat), config.get_plugin / config.get_all (another plugin's secrets left
out), component.enable / component.disable (a plugin's own components)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chat.models import Message
from plugins import host as hosts
from plugins.capabilities import components, config, message
from plugins.host import PluginHost
from plugins.manifest import Manifest
from plugins.records import ComponentInfo, PluginRecord, PluginState
from tests.chat.planner_helpers import inbound_store

pytestmark = pytest.mark.django_db(transaction=True)

MANIFEST = {
    "manifest_version": 2,
    "version": "1.0.0",
    "name": "p",
    "host_application": {"min_version": "1.0.0", "max_version": "1.99.99"},
    "sdk": {"min_version": "2.0.0", "max_version": "2.99.99"},
}


# MaiBot 1.3.15's capability registry (src/plugin_runtime/capabilities/registry.py, 73 names).
MAIBOT_13_CAPABILITIES = {
    "api.call", "api.get", "api.list", "api.replace_dynamic", "chat.get_all_streams", "chat.get_group_streams",
    "chat.get_private_streams", "chat.get_stream_by_group_id", "chat.get_stream_by_user_id", "chat.open_session",
    "component.disable", "component.enable", "component.get_all_plugins", "component.get_plugin_config_schema",
    "component.get_plugin_info", "component.list_loaded_plugins", "component.list_registered_plugins",
    "component.load_plugin", "component.reload_plugin", "component.unload_plugin",
    "component.update_plugin_config", "config.get", "config.get_all", "config.get_plugin", "database.count",
    "database.delete", "database.get", "database.query", "database.save", "emoji.delete", "emoji.get_all",
    "emoji.get_by_description", "emoji.get_count", "emoji.get_emotions", "emoji.get_info", "emoji.get_random",
    "emoji.register", "frequency.get_adjust", "frequency.get_current_talk_value", "frequency.set_adjust",
    "knowledge.search", "llm.embed", "llm.generate", "llm.generate_with_tools", "llm.get_available_models",
    "llm.transcribe_audio", "maisaka.context.append", "maisaka.proactive.trigger", "message.build_readable",
    "message.count_new", "message.get_by_id", "message.get_by_time", "message.get_by_time_in_chat",
    "message.get_recent", "person.get_id", "person.get_id_by_name", "person.get_value", "render.html2png",
    "send.command", "send.custom", "send.emoji", "send.forward", "send.hybrid", "send.image", "send.text",
    "statistics.local.message_trend", "statistics.local.model_trend", "statistics.local.models",
    "statistics.local.online_time_trend", "statistics.local.token_distribution", "statistics.local.token_trend",
    "statistics.local.tool_trend", "tool.get_definitions",
}  # fmt: skip


def test_every_capability_maibot_13_answers_is_answered_here():
    from plugins.capabilities import SUPPORTED

    assert len(MAIBOT_13_CAPABILITIES) == 73
    assert sorted(MAIBOT_13_CAPABILITIES - SUPPORTED) == []


def record(plugin_id: str, **fields) -> PluginRecord:
    manifest = Manifest.model_validate({**MANIFEST, "id": plugin_id})
    return PluginRecord(folder=Path("/nonexistent"), plugin_id=plugin_id, manifest=manifest, **fields)


def test_message_get_by_time_reads_every_chat_in_the_window(make_session):
    alice, bob = make_session(user_id="5001"), make_session(user_id="5002")
    now = datetime.now(UTC)
    old = inbound_store(session=alice, text="long ago")
    Message.objects.filter(pk=old.pk).update(time=now - timedelta(days=3))
    inbound_store(session=alice, text="甲")
    inbound_store(session=bob, text="乙")
    start, end = (now - timedelta(hours=1)).timestamp(), (now + timedelta(hours=1)).timestamp()
    me = record("test.maibot.reader")

    window = asyncio.run(message.get_by_time(me, {"start_time": str(start), "end_time": str(end)}))
    assert window["success"] is True
    assert [(m["processed_plain_text"], m["session_id"]) for m in window["messages"]] == [
        ("甲", alice.session_id),
        ("乙", bob.session_id),
    ]
    latest = asyncio.run(message.get_by_time(me, {"start_time": start, "end_time": end, "limit": 1}))
    assert [m["processed_plain_text"] for m in latest["messages"]] == ["乙"]
    bad = asyncio.run(message.get_by_time(me, {"start_time": "yesterday", "end_time": end}))
    assert bad["success"] is False and "neither a Unix timestamp" in bad["error"]


def test_config_get_plugin_reads_its_own_whole_and_another_without_its_secrets(monkeypatch):
    me = record("test.maibot.reader", config={"plugin": {"enabled": True}, "api": {"token": "mine"}})
    napcat = record("maibot-team.napcat-adapter", state=PluginState.LOADED)
    napcat.config = {"napcat_server": {"host": "127.0.0.1", "port": 3001, "token": "秘密"}, "plugin": {"enabled": True}}
    host = PluginHost()
    host.records = {me.plugin_id: me, napcat.plugin_id: napcat}
    monkeypatch.setattr(hosts, "host", host)

    assert asyncio.run(config.get_plugin(me, {"plugin_name": None}))["value"]["api"] == {"token": "mine"}
    assert asyncio.run(config.get_all(me, {}))["value"] == me.config
    other = asyncio.run(config.get_plugin(me, {"plugin_name": "maibot-team.napcat-adapter"}))
    assert other == {
        "success": True,
        "value": {"napcat_server": {"host": "127.0.0.1", "port": 3001}, "plugin": {"enabled": True}},
    }
    port = asyncio.run(
        config.get_plugin(me, {"plugin_name": "maibot-team.napcat-adapter", "key": "napcat_server.port"})
    )
    assert port == {"success": True, "value": 3001}
    token = {"plugin_name": "maibot-team.napcat-adapter", "key": "napcat_server.token", "default": "?"}
    assert asyncio.run(config.get_plugin(me, token)) == {"success": True, "value": "?"}
    missing = asyncio.run(config.get_all(me, {"plugin_name": "no.such.plugin"}))
    assert missing["success"] is False and "no.such.plugin" in missing["error"]


def test_component_switches_are_a_plugins_own_and_kept_while_it_loads():
    tool = ComponentInfo(name="open_private_chat", type="TOOL", handler="h", metadata={"enabled": False}, enabled=False)
    me = record("test.maibot.switcher", state=PluginState.LOADED, components=[tool])
    args = {"name": "open_private_chat", "component_type": "TOOL", "scope": "global", "stream_id": ""}

    assert asyncio.run(components.enable(me, args)) == {"success": True} and tool.enabled is True
    assert asyncio.run(components.disable(me, args)) == {"success": True} and tool.enabled is False
    unknown = asyncio.run(components.enable(me, {**args, "name": "someone_elses_tool"}))
    assert unknown["success"] is False and "未找到组件" in unknown["error"]
    scoped = asyncio.run(components.enable(me, {**args, "stream_id": "abc"}))
    assert scoped["success"] is False
    hook = asyncio.run(components.disable(me, {**args, "component_type": "HOOK_HANDLER"}))
    assert hook["success"] is False and "cannot be switched" in hook["error"]

    loading = record("test.maibot.loading")  # on_load runs before the host has its components
    assert asyncio.run(components.enable(loading, args)) == {"success": True}
    assert loading.switches == {("open_private_chat", "TOOL"): True}


def test_send_command_sends_the_command_segment_adapters_run(make_session):
    from chat.outbox_rows import outbox_claim
    from plugins.capabilities import send

    session = make_session(chat_type="group", group_id="555")
    me = record("test.maibot.admin")
    command = {"name": "SET_GROUP_BAN", "args": {"qq_id": 10001, "duration": 60}}
    result = asyncio.run(send.send_command(me, {"command": command, "stream_id": session.session_id}))
    assert result["success"] is True
    sent = Message.objects.get(direction="out")
    assert sent.segments == [{"type": "command", "data": command}] and sent.extra["capability"] == "send.command"
    # A websocket adapter gets it as the top-level command segment; an adapter plugin's gateway, which
    # accepts no commands, fails it as unsupported rather than sending "[unsupported:command]" to QQ.
    _, (for_adapter,) = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={})
    assert for_adapter.frame["message_segment"] == {"type": "command", "data": command}
    Message.objects.filter(pk=sent.pk).update(delivery_status="pending", delivery_attempts=0)
    _, (for_gateway,) = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={"qq": ["text", "image"]})
    assert for_gateway.error == "unsupported_segments"
    missing = asyncio.run(send.send_command(me, {"stream_id": session.session_id}))
    assert missing["success"] is False and "needs command" in missing["error"]


def test_llm_generate_with_tools_offers_the_tools_and_answers_the_calls_in_maibots_shape():
    from chat.models import LLMCall
    from core.config import override
    from plugins.capabilities import llm
    from tests.fake_llm import FakeLLM

    me = record("test.maibot.toolcaller")
    weather = {"name": "get_weather", "description": "天气", "parameters": {"type": "object", "properties": {}}}
    with (
        FakeLLM() as fake,
        override(llm={"base_url": fake.base_url, "model": "fake-model", "max_retries": 0}),
    ):
        fake.script(fake.tool_call("get_weather", {"city": "北京"}))
        answer = asyncio.run(llm.generate_with_tools(me, {"prompt": "北京天气？", "tools": [weather]}))
        offered = fake.requests[0]["tools"]
        refused = asyncio.run(llm.generate_with_tools(me, {"prompt": "x", "tools": [{"name": "bad name!"}]}))
    assert answer["success"] is True
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in answer["tool_calls"]] == [
        ("get_weather", {"city": "北京"})
    ]
    assert offered == [{"type": "function", "function": weather}]
    assert refused["success"] is False and "name of 1-64" in refused["error"]
    assert LLMCall.objects.get().purpose == "plugin:test.maibot.toolcaller"
