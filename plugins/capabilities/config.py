"""config.get: our bot_config.toml, read with dotted keys (e.g. bot.nickname). Keys naming a key, secret,
token or password are never answered, and every secret value (core.redaction: MCP headers and env,
the deployment's keys and tokens) reads `<redacted>` wherever it is, whatever the key."""

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
