"""config.get: our bot_config.toml, read with dotted keys (e.g. bot.nickname); keys naming a key,
secret, token or password are never answered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from plugins.records import PluginRecord

SECRET_WORDS = ("api_key", "secret", "token", "password")


async def get(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from maibot.config import get_config

    key = str(args.get("key") or "").strip()
    default = args.get("default")
    if not key or len(key) > 200:
        return {"success": False, "value": default, "error": "config.get needs a key (dotted, e.g. bot.nickname)"}
    if any(word in key.lower() for word in SECRET_WORDS):
        return {"success": False, "value": default, "error": f"config key {key} is not readable by plugins"}
    value: Any = get_config()
    for part in key.split("."):
        if isinstance(value, dict):
            if part not in value:
                return {"success": True, "value": default}
            value = value[part]
        elif isinstance(value, BaseModel) and part in type(value).model_fields:
            value = getattr(value, part)
        else:
            return {"success": True, "value": default}
    if isinstance(value, BaseModel):
        value = _without_secrets(value.model_dump(mode="json"))
    elif isinstance(value, list):
        value = [_without_secrets(v.model_dump(mode="json")) if isinstance(v, BaseModel) else v for v in value]
    return {"success": True, "value": value}


def _without_secrets(value: Any) -> Any:
    # A whole section (config.get("llm")) must not carry what a dotted key may not read.
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items() if not any(w in str(k).lower() for w in SECRET_WORDS)}
    if isinstance(value, list):
        return [_without_secrets(v) for v in value]
    return value
