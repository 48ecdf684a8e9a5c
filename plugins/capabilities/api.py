"""api.*: a plugin calls another plugin's @API component (plugins.plugin_apis resolves the name,
checks it is public, and calls it through the host), or asks which APIs it may call."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugins.records import PluginRecord

# An API call's own time limit within the capability call's (which is 30 s unless the caller says).
API_TIMEOUT = 25.0


async def call(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from plugins import plugin_apis

    api_name = str(args.get("api_name") or "").strip()
    version = str(args.get("version") or "").strip()
    api_args = args.get("args", {})
    if not api_name or len(api_name) > 300:
        return {"success": False, "error": "api.call needs api_name (plugin_id.name or a unique short name)"}
    if api_args is None:
        api_args = {}
    if not isinstance(api_args, dict):
        return {"success": False, "error": "api.call's args must be an object"}
    try:
        result = await plugin_apis.call_api(record, "", api_name, api_args, API_TIMEOUT, version=version)
    except plugin_apis.PluginApiError as exc:
        return {"success": False, "error": str(exc)}
    except TimeoutError:
        return {"success": False, "error": f"API {api_name} did not answer within {API_TIMEOUT:g}s"}
    except Exception as exc:  # the called plugin's own failure is the caller's error result
        return {"success": False, "error": f"API {api_name} failed: {type(exc).__name__}: {exc}"[:500]}
    return {"success": True, "result": result}


async def get(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from plugins import plugin_apis

    api_name = str(args.get("api_name") or "").strip()
    if not api_name:
        return {"success": False, "error": "api.get needs api_name"}
    return {"success": True, "api": plugin_apis.describe_api(record, "", api_name, str(args.get("version") or ""))}


async def list_apis(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from plugins import plugin_apis

    return {"success": True, "apis": plugin_apis.visible_apis(record, str(args.get("plugin_id") or "").strip())}


async def replace_dynamic(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """api.replace_dynamic: the plugin's dynamic APIs become `apis` (MaiBot 1.3's arguments and result;
    the SDK's register_dynamic_api builds them, its invoke_component answers their calls). A plugin
    declares only its own; one may not replace its @API components. Those dropped are unregistered:
    a caller is told no such API is loaded (MaiBot answers with `offline_reason`)."""
    from plugins import plugin_apis, records
    from plugins.records import ComponentInfo

    raw = args.get("apis", [])
    if not isinstance(raw, list):
        return {"success": False, "error": "参数 apis 必须为列表"}
    declared = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            return {"success": False, "error": f"apis[{index}] 必须为字典"}
        name = str(item.get("name") or "").strip()
        kind = str(item.get("component_type", item.get("type", "API")) or "").strip().upper()
        if not name or len(name) > 128 or "." in name:
            return {"success": False, "error": f"apis[{index}] 缺少 name (a name without dots, ≤ 128)"}
        if kind != "API":
            return {"success": False, "error": f"apis[{index}] 不是 API 组件"}
        metadata = dict(item["metadata"]) if isinstance(item.get("metadata"), dict) else {}
        metadata.update(dynamic=True, version=str(metadata.get("version") or "1").strip() or "1")
        handler = str(metadata.get("handler_name") or f"dynamic_api__{name}__{metadata['version']}")
        declared.append(ComponentInfo(name=name, type="API", handler=handler, metadata=metadata, registered=True))
    host = records.host_of(record.plugin_id)
    if host is None:
        return {"success": False, "error": f"未找到插件: {record.plugin_id}"}
    try:
        count, offlined = plugin_apis.replace_dynamic_apis(host, record, declared)
    except plugin_apis.PluginApiError as exc:
        return {"success": False, "error": str(exc)}
    return {"success": True, "count": count, "offlined": offlined}
