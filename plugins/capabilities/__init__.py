"""The capabilities a plugin calls (`ctx.<capability>.<method>(...)` → `rpc_call("cap.call", plugin_id,
{"capability": ..., "args": {...}})`), answered with our data and services, one module per domain:
send (the one send service), chat (streams = our sessions), message, llm (our client: routing, budgets,
the ledger), config, render (headless Chromium), maisaka (the planner's context and proactive turns),
api (plugins' @API components), components (a plugin's own tools and commands switched on or off),
database (a plugin's own rows, bounded), person (the people who wrote to the bot),
emoji (the emoji library).

Arguments and results are those the SDK (maibot-plugin-sdk 2.16.0) sends and expects, in the shapes
MaiBot's own host returns. As in MaiBot, a plugin may call only the capabilities its manifest
declares; anything else, and every capability not answered here, raises RuntimeError in the plugin
with the reason ("... is not supported by this host"), as MaiBot's runner raises on an error answer.
Bad arguments are an error result (`success: false` and `error`), never a crash. Every call has a
timeout (30 s, or the call's `timeout_ms`, at most 300 s). Sends and media bytes draw from the plugin's
budgets (plugins.limits): past them the call raises in the plugin with the reason. Each handler is
`async def handler(record, args) -> dict`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from plugins import limits
from plugins.capabilities import (
    api,
    chat,
    components,
    config,
    database,
    emoji,
    frequency,
    knowledge,
    llm,
    maisaka,
    message,
    person,
    render,
    send,
    statistics,
)
from plugins.capabilities.common import message as _message  # noqa: F401  (plugins.bridge uses it)

if TYPE_CHECKING:
    from plugins.records import PluginRecord

logger = logging.getLogger(__name__)

MAX_CAPABILITY_TIMEOUT = 300.0
DEFAULT_CAPABILITY_TIMEOUT = 30.0

Capability = Callable[["PluginRecord", dict[str, Any]], Awaitable[Any]]

IMPLEMENTATIONS: dict[str, Capability] = {
    "send.text": send.send_text,
    "send.image": send.send_image,
    "send.emoji": send.send_emoji,
    "send.custom": send.send_custom,
    "send.command": send.send_command,
    "send.forward": send.send_forward,
    "send.hybrid": send.send_hybrid,
    "config.get": config.get,
    "config.get_plugin": config.get_plugin,
    "config.get_all": config.get_all,
    "llm.generate": llm.generate,
    "llm.generate_with_tools": llm.generate_with_tools,
    "llm.get_available_models": llm.get_available_models,
    "llm.embed": llm.embed,
    "llm.transcribe_audio": llm.transcribe_audio,
    "message.get_recent": message.get_recent,
    "message.get_by_id": message.get_by_id,
    "message.get_by_time_in_chat": message.get_by_time_in_chat,
    "message.get_by_time": message.get_by_time,
    "message.build_readable": message.build_readable,
    "chat.get_all_streams": chat.get_all_streams,
    "chat.get_group_streams": chat.get_group_streams,
    "chat.get_private_streams": chat.get_private_streams,
    "chat.get_stream_by_group_id": chat.get_stream_by_group_id,
    "chat.get_stream_by_user_id": chat.get_stream_by_user_id,
    "chat.open_session": chat.open_session,
    "maisaka.context.append": maisaka.context_append,
    "maisaka.proactive.trigger": maisaka.proactive_trigger,
    "render.html2png": render.html2png,
    "api.call": api.call,
    "api.get": api.get,
    "api.list": api.list_apis,
    "api.replace_dynamic": api.replace_dynamic,
    "component.enable": components.enable,
    "component.disable": components.disable,
    "database.get": database.get,
    "database.save": database.save,
    "database.query": database.query,
    "database.count": database.count,
    "database.delete": database.delete,
    "person.get_id": person.get_id,
    "person.get_value": person.get_value,
    "person.get_id_by_name": person.get_id_by_name,
    "emoji.get_by_description": emoji.get_by_description,
    "emoji.get_random": emoji.get_random,
    "emoji.get_count": emoji.get_count,
    "emoji.get_emotions": emoji.get_emotions,
    "emoji.get_all": emoji.get_all,
    "emoji.get_info": emoji.get_info,
    "emoji.register": emoji.register,
    "emoji.delete": emoji.delete,
    "message.count_new": message.count_new,
    "frequency.set_adjust": frequency.set_adjust,
    "frequency.get_adjust": frequency.get_adjust,
    "frequency.get_current_talk_value": frequency.get_current_talk_value,
    "tool.get_definitions": components.tool_definitions,
    "component.get_all_plugins": components.get_all_plugins,
    "component.get_plugin_info": components.get_plugin_info,
    "component.list_loaded_plugins": components.list_loaded_plugins,
    "component.list_registered_plugins": components.list_loaded_plugins,
    "component.reload_plugin": components.reload_plugin,
    "component.get_plugin_config_schema": components.get_plugin_config_schema,
    "component.update_plugin_config": components.update_plugin_config,
    "component.load_plugin": components.load_plugin,
    "component.unload_plugin": components.unload_plugin,
    "knowledge.search": knowledge.search,
    "statistics.local.models": statistics.models,
    "statistics.local.model_trend": statistics.model_trend,
    "statistics.local.token_trend": statistics.token_trend,
    "statistics.local.token_distribution": statistics.token_distribution,
    "statistics.local.message_trend": statistics.message_trend,
    "statistics.local.tool_trend": statistics.tool_trend,
    "statistics.local.online_time_trend": statistics.online_time_trend,
}
SUPPORTED = frozenset(IMPLEMENTATIONS)


def _timeout(capability: str, args: dict[str, Any], timeout_ms: Any) -> float:
    # As MaiBot's runner: the call's own timeout, else rpc_timeout_ms / _timeout_ms / timeout_ms in
    # the arguments (render.html2png's timeout_ms is its render time, not the call's).
    if timeout_ms is None:
        for key in ("rpc_timeout_ms", "_timeout_ms", "timeout_ms"):
            if key == "timeout_ms" and capability == "render.html2png":
                continue
            if key in args:
                timeout_ms = args.pop(key)
                break
    if timeout_ms is None:
        return DEFAULT_CAPABILITY_TIMEOUT
    try:
        seconds = int(timeout_ms) / 1000
    except (TypeError, ValueError):
        raise ValueError(f"invalid timeout_ms: {timeout_ms!r}") from None
    if seconds <= 0:
        raise ValueError(f"timeout_ms must be positive: {timeout_ms!r}")
    return min(seconds, MAX_CAPABILITY_TIMEOUT)


def make_context(record: PluginRecord):
    """The PluginContext of one plugin: its rpc_call answers `cap.call` with IMPLEMENTATIONS."""
    from maibot_sdk import PluginContext, PluginPaths

    async def rpc_call(method: str, plugin_id: str = "", payload: dict[str, Any] | None = None, timeout_ms=None) -> Any:
        # Whatever id the caller names, the call is this plugin's (as in MaiBot's runner).
        if method != "cap.call":
            raise RuntimeError(f"host method {method} is not supported by this host")
        request = dict(payload or {})
        capability = str(request.get("capability") or "").strip()
        args = request.get("args")
        args = dict(args) if isinstance(args, dict) else {}
        timeout = _timeout(capability, args, timeout_ms)
        if capability not in record.declared_capabilities:
            raise RuntimeError(
                f"capability {capability or '(none)'} is not declared in plugin {record.plugin_id}'s manifest"
            )
        impl = IMPLEMENTATIONS.get(capability)
        if impl is None:
            raise RuntimeError(f"capability {capability} is not supported by this host")
        try:
            if capability.startswith("send."):
                limits.charge_send(record)
            return await asyncio.wait_for(impl(record, args), timeout)
        except limits.PluginLimitExceeded as exc:
            # Counted on the record (the admin shows it) when refused; the plugin gets the reason.
            raise RuntimeError(f"capability {capability} refused: {exc}") from None
        except TimeoutError:
            record.error(f"capability {capability} timed out after {timeout:g}s")
            raise RuntimeError(f"capability {capability} did not answer within {timeout:g}s") from None
        except Exception as exc:
            logger.exception("plugin %s: capability %s failed", record.plugin_id, capability)
            record.error(f"capability {capability}: {type(exc).__name__}: {exc}"[:500])
            raise RuntimeError(f"capability {capability} failed: {exc}") from None

    base = Path(settings.DATA_DIR)
    paths = PluginPaths(
        data_dir=base / "plugin-data" / record.plugin_id, runtime_dir=base / "plugin-runtime" / record.plugin_id
    )
    return PluginContext(record.plugin_id, rpc_call=rpc_call, paths=paths)
