"""Plugins' `@API` components: who offers which API, and one way to call them (`call_api`).

A plugin declares `@API("name", version="1", public=True)`; another calls it with
`await self.ctx.api.call("plugin_id.name", version="", **kwargs)` (or the API's short name when only
one plugin offers it). The capability handler of `api.call` (plugins.capabilities) resolves the name
with `resolve_api` and calls `call_api`; `api.get` / `api.list` answer with `describe_api` /
`visible_apis`. As in MaiBot: a non-public API is callable by its own plugin only; an empty version
means the newest the plugin offers. The call goes through the host's `ComponentHost.invoke` protocol,
so it runs wherever the plugin's code runs (this process or a runner), with the caller's timeout.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugins.records import ComponentHost, ComponentInfo, PluginRecord


class PluginApiError(LookupError):
    """A call that cannot be made: no such API, ambiguous short name, not public. The message says why."""


@dataclass(frozen=True)
class RegisteredApi:
    host: ComponentHost
    record: PluginRecord
    component: ComponentInfo

    @property
    def plugin_id(self) -> str:
        return self.record.plugin_id

    @property
    def name(self) -> str:
        return self.component.name

    @property
    def version(self) -> str:
        return str(self.component.metadata.get("version") or "1")

    @property
    def public(self) -> bool:
        return bool(self.component.metadata.get("public"))

    def describe(self) -> dict[str, Any]:
        return {
            "plugin_id": self.plugin_id,
            "name": self.name,
            "full_name": f"{self.plugin_id}.{self.name}",
            "version": self.version,
            "public": self.public,
            "description": str(self.component.metadata.get("description") or ""),
        }


# (plugin_id, api name, version) -> the API; swapped whole under the lock (readers never lock).
_apis: dict[tuple[str, str, str], RegisteredApi] = {}
_lock = threading.Lock()


def register_api(host: ComponentHost, record: PluginRecord, component: ComponentInfo) -> None:
    api = RegisteredApi(host=host, record=record, component=component)
    key = (api.plugin_id, api.name, api.version)
    global _apis
    with _lock:
        if key in _apis:
            raise ValueError(f"API {api.plugin_id}.{api.name} version {api.version} is already registered")
        _apis = {**_apis, key: api}
    host.on_unregister(lambda: unregister_api(key))


def unregister_api(key: tuple[str, str, str]) -> None:
    global _apis
    with _lock:
        _apis = {k: v for k, v in _apis.items() if k != key}


def _version_key(version: str) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)


def resolve_api(caller: PluginRecord | None, plugin_id: str, api_name: str, version: str = "") -> RegisteredApi:
    """The API `plugin_id`.`api_name` (plugin_id "" and api_name "a.b" or a unique short name allowed)
    of `version` (""; the newest), callable by `caller` (None: the host itself). Raises PluginApiError."""
    apis = _apis
    if not plugin_id and "." in api_name:
        # "plugin_id.api_name": plugin ids contain dots too, so the API name is after the last one.
        plugin_id, _, api_name = api_name.rpartition(".")
    if plugin_id:
        candidates = [a for a in apis.values() if a.plugin_id == plugin_id and a.name == api_name]
        shown = f"{plugin_id}.{api_name}"
    else:
        candidates = [a for a in apis.values() if a.name == api_name]
        shown = api_name
        owners = sorted({a.plugin_id for a in candidates})
        if len(owners) > 1:
            several = ", ".join(owners)
            raise PluginApiError(f"API name {api_name!r} is offered by several plugins ({several}): use plugin_id.name")
    if version:
        candidates = [a for a in candidates if a.version == str(version)]
    if not candidates:
        raise PluginApiError(f"no API {shown}" + (f" version {version}" if version else "") + " is loaded")
    api = max(candidates, key=lambda a: _version_key(a.version))
    if not api.public and (caller is None or caller.plugin_id != api.plugin_id):
        raise PluginApiError(f"API {api.plugin_id}.{api.name} is not public: only its own plugin may call it")
    return api


def describe_api(caller: PluginRecord | None, plugin_id: str, api_name: str, version: str = "") -> dict | None:
    """`api.get`: the API's description, None when the caller may not see it (or there is none)."""
    try:
        return resolve_api(caller, plugin_id, api_name, version).describe()
    except PluginApiError:
        return None


def visible_apis(caller: PluginRecord | None, plugin_id: str = "") -> list[dict[str, Any]]:
    """`api.list`: the APIs the caller may call (public ones, and its own), optionally of one plugin."""
    own = caller.plugin_id if caller is not None else None
    return [
        a.describe()
        for a in sorted(_apis.values(), key=lambda a: (a.plugin_id, a.name, _version_key(a.version)))
        if (a.public or a.plugin_id == own) and (not plugin_id or a.plugin_id == plugin_id)
    ]


async def call_api(
    caller_record: PluginRecord | None,
    plugin_id: str,
    api_name: str,
    args: dict[str, Any],
    timeout: float,
    *,
    version: str = "",
) -> Any:
    """Call an API with keyword arguments `args`, waiting at most `timeout` seconds; returns what its
    handler returned. Raises PluginApiError (cannot be called), TimeoutError, or the handler's exception
    (as the host reports it). Safe from any event loop; no thread waits for the answer (a slow API,
    called from many chats at once, holds none of the threads the capabilities need)."""
    api = resolve_api(caller_record, plugin_id, api_name, version)
    if not isinstance(args, dict):
        raise PluginApiError("the API's arguments must be a JSON object")
    return await api.host.ainvoke(api.record, api.component, dict(args), timeout)


MAX_DYNAMIC_APIS = 64  # dynamic APIs one plugin may offer at once


def replace_dynamic_apis(host: ComponentHost, record: PluginRecord, declared: list[ComponentInfo]) -> tuple[int, int]:
    """Make `declared` the plugin's dynamic APIs (api.replace_dynamic): the plugin's previous dynamic
    APIs not in it go away. Raises PluginApiError when one would replace a static (@API) API of the
    plugin, or when there are more than MAX_DYNAMIC_APIS. Returns (registered, taken offline)."""
    global _apis
    if len(declared) > MAX_DYNAMIC_APIS:
        raise PluginApiError(f"a plugin may offer at most {MAX_DYNAMIC_APIS} dynamic APIs")
    with _lock:
        mine = {k: a for k, a in _apis.items() if k[0] == record.plugin_id}
        new: dict[tuple[str, str, str], RegisteredApi] = {}
        for component in declared:
            api = RegisteredApi(host=host, record=record, component=component)
            key = (api.plugin_id, api.name, api.version)
            if key in mine and not mine[key].component.metadata.get("dynamic"):
                raise PluginApiError(f"动态 API 不能覆盖静态 API: {key[0]}.{key[1]}@{key[2]}")
            if key in new:
                raise PluginApiError(f"动态 API 重复声明: {key[0]}.{key[1]}@{key[2]}")
            new[key] = api
        offline = [k for k, a in mine.items() if a.component.metadata.get("dynamic") and k not in new]
        _apis = {**{k: v for k, v in _apis.items() if k not in offline}, **new}
    for key in new.keys() - mine.keys():  # gone when the plugin unloads or reloads, as its @APIs
        host.on_unregister(lambda key=key: unregister_api(key), record.plugin_id)
    return len(new), len(offline)
