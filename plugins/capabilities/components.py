"""component.enable / component.disable: a plugin switches one of its own tools or commands on or off (the
NapCat adapter plugin switches its optional tools by its config at every load). Arguments and results as
MaiBot 1.2's host (src/plugin_runtime/capabilities/components.py): `name`, `component_type`, `scope`
("global" only), `stream_id` ("" only), `version`; {"success": true} or {"success": false, "error"}.

Unlike MaiBot, only the calling plugin's own components can be switched: a plugin must not silence
another's. A switch made while its runner loads (on_load runs before the host has the components) is kept
on the record and applied when they register. A switched-off tool is not offered to the model (and
refuses a call that names it); a switched-off command is not asked (plugins.bridge)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugins.records import PluginState

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
