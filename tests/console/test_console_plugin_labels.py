"""The Plugins page and a plugin's config page in the operator's language, with plugins on them: a record of
every state a plugin can be in (loaded, disabled, refused, failed, removed) and every state of its runner,
with components of every kind, refusals by every limit, a failed reload and installed dependencies, under
each sandbox the page can report. Set to Simplified Chinese, no English is left but names, identifiers and
what the host wrote (reasons, errors, notes: data, shown as written); set to English, no Chinese.

The records are the host's own (plugins.records), filled in as the host fills them, on a stand-in host:
no runner is started. The checks are tests/console/test_console_labels.py's."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from django.utils.text import capfirst

from plugins import host as plugin_host
from plugins import manifest as mf
from plugins import sandbox
from plugins.deps import InstallOutcome
from plugins.host_base import ReloadOutcome
from plugins.limits import PluginLimits
from plugins.records import ComponentInfo, PluginRecord, PluginState
from tests.conftest import ROOT
from tests.console.test_console_labels import EN, ZH, chinese, english_in, get, visible_texts

pytestmark = [pytest.mark.django_db, pytest.mark.backend_independent]

FIXTURES = ROOT / "tests" / "plugins" / "fixtures"
WEATHER = "test.maibot.weather"
PROBLEM = "bwrap is not installed (apt-get install bubblewrap)"
# Each sandbox the page reports: MAIBOT_PLUGIN_SANDBOX, what the probe found, whether the server is root.
SANDBOXES = {
    "root, slirp4netns": ("on", sandbox.Support("", network=True), True),
    "user namespace, no slirp4netns": ("on", sandbox.Support("", network=False), False),
    "off": ("off", sandbox.Support("", network=True), False),
    "cannot run": ("on", sandbox.Support(PROBLEM), False),
}


def limits(network: str, memory_mb: int = 512) -> PluginLimits:
    return PluginLimits(network, memory_mb, 10.0, 64, 256, 50, 20, 10)


def component(name: str, kind: str, note: str = "", **metadata) -> ComponentInfo:
    return ComponentInfo(name, kind, name, metadata, registered=not note, note=note)


def started(record: PluginRecord, network: str, **fields) -> PluginRecord:
    """The record as plugins.runners leaves it once a runner started for it."""
    record.limits = limits(network, fields.pop("memory_mb", 512))
    record.sandbox = sandbox.describe(record.plugin_id, network)
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def loaded_weather(tmp_path) -> PluginRecord:
    manifest = mf.read_manifest(FIXTURES / "weather")
    (tmp_path / "weather").mkdir()
    (tmp_path / "weather" / "config.toml").write_text("[plugin]\nenabled = true\n", encoding="utf-8")
    components = [
        component("get_weather", "TOOL"),
        component("wave", "TOOL", legacy_action=True),
        component("forecast", "COMMAND"),
        component("weather_api", "API"),
        component("on_message", "EVENT_HANDLER"),
        component("before_reply", "HOOK_HANDLER"),
        component("tone", "REPLY_EXTENSION", "REPLY_EXTENSION components are not supported by this host yet"),
        component("card", "HOME_CARD", "HOME_CARD components are not supported by this host yet"),
        component("qq_gateway", "MESSAGE_GATEWAY", "message gateways are for adapter plugins"),
    ]
    record = PluginRecord(folder=tmp_path / "weather", plugin_id=manifest.id, manifest=manifest)
    return started(
        record,
        "isolated",
        state=PluginState.LOADED,
        runner_state="running",
        process=SimpleNamespace(pid=4321, alive=True),
        restarts=2,
        allow_hot_reload=False,
        reloaded_at="2026-05-01T08:00:00Z",
        reload_error="reload from the admin failed (the previous version keeps running): SyntaxError: bad input",
        last_install=InstallOutcome(True, ["pydantic>=2.0"], "Successfully installed pydantic", "2026-05-01T07:59:00Z"),
        components=components,
        warnings=["an adapter plugin with network isolated: it cannot reach this machine's loopback"],
        unsupported_capabilities=["send.video"],
        calls=12,
        errors=1,
        latency_ms_total=48.0,
        recent_errors=["2026-05-01T08:01:00Z get_weather: TimeoutError: the call took too long"],
        refusals={"sends": 1, "media": 2, "cpu": 1, "memory": 1, "database": 1},
        last_refusal="2026-05-01T08:02:00Z plugin test.maibot.weather sent 20 messages within a minute",
    )


def records(tmp_path) -> list[PluginRecord]:
    """One record of every plugin state, their runners in every runner state."""

    def of(fixture: str, state: PluginState, reason: str) -> PluginRecord:
        manifest = mf.read_manifest(FIXTURES / fixture)
        return PluginRecord(tmp_path / fixture, manifest.id, state, reason, manifest)

    disabled = of("needs_package", PluginState.DISABLED, "disabled in its config.toml ([plugin] enabled = false)")
    failed = of("raises_on_import", PluginState.FAILED, "ImportError: this plugin needs a module that is not there")
    removed = of("cycle_a", PluginState.REMOVED, "its folder cycle_a/ was removed from the plugins folder")
    unruly = of("unruly", PluginState.LOADED, "")
    return [
        loaded_weather(tmp_path),
        started(disabled, "host", runner_state="stopped", memory_mb=0),
        started(failed, "none", runner_state="crashed", restarts=5),
        started(unruly, "isolated", runner_state="restarting", process=SimpleNamespace(pid=4400, alive=False)),
        removed,
        PluginRecord(tmp_path / "no_manifest", reason="no _manifest.json in the folder"),
    ]


def written(shown: list[PluginRecord]) -> list[str]:
    """What the host wrote on the records (and the probe's problem): data, shown as written."""
    texts = [PROBLEM]
    for r in shown:
        texts += [r.name, r.folder.name, r.reason, r.reload_error, r.last_refusal, *r.warnings, *r.recent_errors]
        texts += [c.note for c in r.components]
        if r.last_install is not None:
            texts.append(r.last_install.summary)
    return sorted({t for t in texts if t}, key=len, reverse=True)


def untranslated(html: str, data: list[str]) -> list[str]:
    """The texts of the page left in English once the data is taken out of them."""
    pattern = re.compile("|".join(re.escape(d) for d in data))
    return [text for text in visible_texts(html) if english_in(pattern.sub(" ", text))]


class StandInHost:
    """What the views read of a plugin host: its records, and a config.toml's validation."""

    def __init__(self, shown: list[PluginRecord]) -> None:
        self.records = {r.plugin_id or r.folder.name: r for r in shown}
        self.outcome = ReloadOutcome(False, "config.toml: Expected '=' after a key (at line 1, column 5)")

    def validate_config(self, plugin_id: str, text: str) -> ReloadOutcome:
        return self.outcome


@pytest.fixture(params=list(SANDBOXES))
def plugins_shown(request, monkeypatch, settings, tmp_path) -> StandInHost:
    setting, support, root = SANDBOXES[request.param]
    settings.MAIBOT_PLUGIN_SANDBOX = setting
    monkeypatch.setattr(sandbox, "support", lambda: support)
    monkeypatch.setattr(sandbox, "as_root", lambda: root)
    host = StandInHost(records(tmp_path))
    monkeypatch.setattr(plugin_host, "host", host)
    return host


def test_every_plugin_state_and_label_is_in_chinese(admin_client, plugins_shown):
    shown = list(plugins_shown.records.values())
    assert {r.state for r in shown} == set(PluginState)
    page = get(admin_client, "/admin/plugins/", ZH)
    assert untranslated(page, written(shown)) == []
    assert "本服务进程的插件" in page and "没有插件" not in page
    for state in ("已加载", "已停用", "已拒绝", "加载失败", "已移除"):
        assert f">{state}</td>" in page, state
    assert "运行中, pid 4321" in page and "重启中<br>" in page and "已崩溃<br>" in page and "已停止<br>" in page
    assert "动作 <code>wave</code>" in page and "API <code>weather_api</code>" in page and "（无 ID）" in page
    assert "已拒绝： 发送: 1, 媒体: 2, CPU 时间: 1, 内存: 1, 数据库: 1" in page
    # The buttons are captioned in Chinese; what they post and where stays the action's identifier.
    for action, caption in (("reload", "重新加载"), ("disable", "停用"), ("install-deps", "安装依赖")):
        assert f'action="/admin/plugins/{WEATHER}/{action}/"' in page
        assert f'name="action" value="{action}">{caption}</button>' in page
    assert 'value="enable">启用</button>' in page  # the disabled plugin's


def test_every_plugin_state_and_label_is_in_english(admin_client, plugins_shown):
    page = get(admin_client, "/admin/plugins/", EN)
    assert chinese(page) == []
    assert "Plugins of this server process" in page and "(no id)" in page and "ACTION <code>wave</code>" in page
    assert "running, pid 4321" in page and "Refused: sends: 1, media: 2, cpu: 1, memory: 1, database: 1" in page
    assert 'name="action" value="install-deps">install-deps</button>' in page


def test_a_plugins_config_page_is_in_the_operators_language(admin_client, plugins_shown):
    url = f"/admin/plugins/{WEATHER}/config/"
    data = [*written(list(plugins_shown.records.values())), plugins_shown.outcome.message]
    for language in (ZH, EN):
        page = get(admin_client, url, language)
        refused = admin_client.post(url, {"toml": "a b"}, HTTP_ACCEPT_LANGUAGE=language).content.decode()
        for html in (page, refused):
            assert (untranslated(html, data) if language == ZH else chinese(html)) == []
        assert ("未保存：" if language == ZH else "Not saved: ") + "config.toml: Expected" in refused
    plugins_shown.outcome = ReloadOutcome(True, "loaded")
    saved = admin_client.post(url, {"toml": "[plugin]\n"}, HTTP_ACCEPT_LANGUAGE=ZH, follow=True).content.decode()
    assert capfirst(f"{WEATHER}：config.toml 已保存并生效（loaded）") in saved  # the admin's messages: capfirst
