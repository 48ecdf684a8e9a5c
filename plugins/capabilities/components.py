"""component.enable / component.disable: a plugin switches one of its own tools or commands on or off (the
NapCat adapter plugin switches its optional tools by its config at every load). Arguments and results as
MaiBot 1.2's host (src/plugin_runtime/capabilities/components.py): `name`, `component_type`, `scope`
("global" only), `stream_id` ("" only), `version`; {"success": true} or {"success": false, "error"}.

Unlike MaiBot, only the calling plugin's own components can be switched: a plugin must not silence
another's. A switch made while its runner loads (on_load runs before the host has the components) is kept
on the record and applied when they register. A switched-off tool is not offered to the model (and
refuses a call that names it); a switched-off command is not asked (plugins.bridge).

Also here, in MaiBot 1.3's shapes: tool.get_definitions (every loaded plugin's enabled tools),
component.get_all_plugins / get_plugin_info / list_loaded_plugins / list_registered_plugins (the loaded
plugins; all loaded plugins are registered here), and component.reload_plugin, which a plugin may ask
only for itself, at most once every SELF_RELOAD_INTERVAL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugins.records import PluginState, parameters_schema

if TYPE_CHECKING:
    from plugins.records import PluginRecord

SWITCHABLE = ("TOOL", "COMMAND")


def _switch(record: PluginRecord, args: dict[str, Any], enabled: bool) -> dict[str, Any]:
    name = str(args.get("name") or "").strip()
    kind = str(args.get("component_type") or "").strip().upper()
    if not name or not kind:
        return {"success": False, "error": "缺少必要参数 name 或 component_type"}
    if str(args.get("scope") or "global") != "global" or args.get("stream_id"):
        return {"success": False, "error": "当前仅支持全局组件启用/禁用，不支持 scope/stream_id 定位"}
    if kind == "ACTION":
        kind = "TOOL"  # the SDK turns an Action into a Tool
    if kind not in SWITCHABLE:
        return {"success": False, "error": f"{kind} components cannot be switched here (only {', '.join(SWITCHABLE)})"}
    component = next((c for c in record.components if c.name == name and c.type == kind), None)
    loading = record.state != PluginState.LOADED or not record.components
    if component is None and not loading:
        return {"success": False, "error": f"未找到组件: {name} ({kind}) in plugin {record.plugin_id}"}
    # Kept for the components its runner registers next (on_load switches before the host has them).
    record.switches[(name, kind)] = enabled
    if component is not None:
        component.enabled = enabled
    return {"success": True}


async def enable(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return _switch(record, args, True)


async def disable(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return _switch(record, args, False)


# --- what plugins are loaded, their tools, and reloading oneself ---------------------------------------

SELF_RELOAD_INTERVAL = 30.0  # seconds between two reloads a plugin asks for itself (one in on_load loops)
_self_reloads: dict[str, float] = {}


def _loaded() -> list[PluginRecord]:
    from plugins import records

    return [r for book in records.host_records() for r in book.values() if r.state == PluginState.LOADED and r.manifest]


def _component(c) -> dict[str, Any]:
    return {"name": c.name, "full_name": c.name, "type": c.type, "enabled": c.enabled, "metadata": c.metadata}


def _info(record: PluginRecord) -> dict[str, Any]:
    description = record.manifest.description if record.manifest else ""
    return {
        "name": record.plugin_id,
        "version": record.version,
        "description": description,
        "author": "",
        "enabled": True,
    }


async def tool_definitions(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """tool.get_definitions: every loaded plugin's enabled tools, as MaiBot's ToolInfo.get_llm_definition."""
    tools = []
    for other in _loaded():
        for c in other.components:
            if c.type == "TOOL" and c.registered and c.enabled:
                description = str(c.metadata.get("description") or c.metadata.get("brief_description") or "")
                definition = {"name": c.name, "description": description}
                definition["parameters_schema"] = parameters_schema(c.metadata)
                tools.append({"name": c.name, "definition": definition})
    return {"success": True, "tools": tools}


async def list_loaded_plugins(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return {"success": True, "plugins": [r.plugin_id for r in _loaded()]}


async def get_all_plugins(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    plugins = {r.plugin_id: {**_info(r), "components": [_component(c) for c in r.components]} for r in _loaded()}
    return {"success": True, "plugins": plugins}


async def get_plugin_info(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    name = str(args.get("plugin_name") or record.plugin_id).strip()
    found = next((r for r in _loaded() if r.plugin_id == name), None)
    if found is None:
        return {"success": False, "error": f"未找到插件: {name}"}
    defaults = {"default_config": found.default_values, "config_schema": found.config_schema}
    return {"success": True, "plugin": {**_info(found), **defaults}}


async def get_plugin_config_schema(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    name = str(args.get("plugin_name") or record.plugin_id).strip()
    found = next((r for r in _loaded() if r.plugin_id == name), None)
    if found is None:
        return {"success": False, "error": f"未找到插件: {name}"}
    return {"success": True, "plugin_id": name, "schema": found.config_schema, "default_config": found.default_values}


async def update_plugin_config(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    # As MaiBot 1.3: only its built-in plugin manager may; there is none here (the operator edits a
    # plugin's config.toml on the Plugins page).
    return {"success": False, "error": "仅插件管理内置插件可以修改插件配置"}


async def load_plugin(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """component.load_plugin: answers for a plugin that is loaded ({"success", "count": 1}); loading one
    that is not (refused, failed, disabled) is the operator's, on the Plugins page."""
    name = str(args.get("plugin_name") or "").strip()
    if not name:
        return {"success": False, "error": "缺少必要参数 plugin_name"}
    if any(r.plugin_id == name for r in _loaded()):
        return {"success": True, "count": 1}
    return {"success": False, "error": f"插件 {name} 热重载失败: plugins are loaded by the operator (admin › Plugins)"}


async def unload_plugin(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return {"success": False, "error": "新运行时不支持单独卸载插件，请使用 reload"}  # MaiBot 1.3's answer


async def reload_plugin(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """component.reload_plugin: a plugin reloads itself (its code and config.toml, as the admin's reload):
    the reload starts once this call has answered, since it replaces the runner that made the call.
    Unlike MaiBot, a plugin cannot reload another (that is the operator's, in the admin)."""
    import threading
    import time

    name = str(args.get("plugin_name") or "").strip()
    if not name:
        return {"success": False, "error": "缺少必要参数 plugin_name"}
    if name != record.plugin_id:
        return {"success": False, "error": f"a plugin may reload only itself here, not {name}"}
    from plugins import records

    host = records.host_of(name)
    if host is None:
        return {"success": False, "error": f"未找到插件: {name}"}
    now = time.monotonic()
    if now - _self_reloads.get(name, -SELF_RELOAD_INTERVAL) < SELF_RELOAD_INTERVAL:
        return {"success": False, "error": f"plugin {name} was reloaded less than {SELF_RELOAD_INTERVAL:g} s ago"}
    _self_reloads[name] = now
    threading.Thread(
        target=host.reload, args=(name,), kwargs={"source": "component.reload_plugin"}, daemon=True
    ).start()
    return {"success": True}
