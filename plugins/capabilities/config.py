"""config.get: our bot_config.toml, read with dotted keys (e.g. bot.nickname). Keys naming a key, secret,
token or password are never answered, and every secret value (core.redaction: MCP headers and env,
the deployment's keys and tokens) reads `<redacted>` wherever it is, whatever the key.

config.get_plugin / config.get_all: a plugin's config.toml as its config_model normalized it (MaiBot 1.2's
arguments and results: `plugin_name`, default the caller; `key` dotted, `default`). A plugin reads its own
whole; another plugin's without the keys naming a key, secret, token or password (MaiBot answers them too:
here one plugin never reads another's NapCat token)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugins.records import PluginRecord

SECRET_WORDS = ("api_key", "secret", "token", "password")


async def get(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from core.config import get_config
    from core.redaction import Secrets, redact_data

    key = str(args.get("key") or "").strip()
    default = args.get("default")
    if not key or len(key) > 200:
        return {"success": False, "value": default, "error": "config.get needs a key (dotted, e.g. bot.nickname)"}
    if any(word in key.lower() for word in SECRET_WORDS):
        return {"success": False, "value": default, "error": f"config key {key} is not readable by plugins"}
    data = get_config().model_dump(mode="json")
    value: Any = redact_data(data, Secrets.of(data), tagged=False)
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return {"success": True, "value": default}
        value = value[part]
    return {"success": True, "value": _without_secrets(value)}


def _without_secrets(value: Any) -> Any:
    # A whole section (config.get("llm")) must not carry what a dotted key may not read.
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items() if not any(w in str(k).lower() for w in SECRET_WORDS)}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value


def _plugin_config(record: PluginRecord, plugin_name: str) -> dict[str, Any] | None:
    """The config of `plugin_name` as `record`'s plugin may read it; None when there is no such plugin."""
    if not plugin_name or plugin_name == record.plugin_id:
        return dict(record.config)
    from plugins import records

    for book in records.host_records():
        other = book.get(plugin_name)
        if other is not None and other.manifest is not None:
            return _without_secrets(dict(other.config))
    return None


async def get_plugin(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    plugin_name = str(args.get("plugin_name") or record.plugin_id).strip()
    key = str(args.get("key") or "").strip()
    default = args.get("default")
    config = _plugin_config(record, plugin_name)
    if config is None:
        return {"success": False, "value": default, "error": f"未找到插件 {plugin_name} 的配置"}
    if not key:
        return {"success": True, "value": config}
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return {"success": True, "value": default}
        value = value[part]
    return {"success": True, "value": value}


async def get_all(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    plugin_name = str(args.get("plugin_name") or record.plugin_id).strip()
    config = _plugin_config(record, plugin_name)
    if config is None:
        return {"success": False, "value": {}, "error": f"未找到插件 {plugin_name} 的配置"}
    return {"success": True, "value": config}
