"""A loaded plugin's components registered into chat's component registry, as built-ins are.

* `@Tool` and `@Action` (the SDK turns an Action into a Tool with `legacy_action`) → planner tools
  (scope "chat"), run by the agent-turn engine with the same recording, timeout (`chat.tool_timeout`)
  and error results as built-in tools. They are async tools: a chat's planner awaits the plugin's
  answer on its own loop, and no thread other chats need waits for it. The handler gets the model's
  arguments plus the chat's `stream_id`, `chat_id`, `group_id`, `user_id`, `platform`; an action also
  gets `action_data` and `reasoning` (as MaiBot passes them). Its result goes back to the model as
  {"ok": true, "result": …} (a non-dict result as {"content": "…"}); an exception as a `tool_failed`
  error.
* `@Command` → a command asked before every planner cycle (and by the offline planner): its
  `pattern` (regex, searched) or one of its `aliases` (prefix) must match the typed text. The handler
  gets text, stream_id, group_id, platform, user_id, matched_groups, message; it returns
  (success, text, intercept) as in MaiBot. When it intercepts, the message never reaches the planner.
  The command is awaited as a tool is, and cut at `chat.tool_timeout`; one that fails or times out
  does not intercept.
* `@MessageGateway` of an adapter plugin → its platform's adapter (plugins.gateways).
* A tool or command declared `enabled=False` (or switched off with `component.disable`, the plugin's
  own components only: plugins.capabilities.components) is registered but neither offered nor asked
  until `component.enable`. Every other component type is listed in the admin and skipped with a note.

A cluster worker's host (`plugins.host.start_for_life_loop`) registers only the tools of scope "life".
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from chat import components as registry
from chat.components import CHAT, LIFE, Command, Tool, ToolContext
from chat.components import ToolErrorCode as Code
from core.config import get_config
from plugins import cache as plugin_cache
from plugins import events as plugin_events
from plugins import gateways, plugin_apis
from plugins.records import parameters_schema

if TYPE_CHECKING:
    from plugins.records import ComponentHost, ComponentInfo, PluginRecord

logger = logging.getLogger(__name__)

MAX_DESCRIPTION = 1024
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-compatible APIs accept as a function name
COMMAND_ORDER = 0  # plugins' commands are asked before the built-in offline commands


def _chat_args(ctx: ToolContext) -> dict[str, Any]:
    session = ctx.session
    if session is None:
        return {}
    out = {"stream_id": session.session_id, "chat_id": session.session_id, "platform": session.platform}
    if session.is_private:
        out["user_id"] = session.user_id
    else:
        out["group_id"] = session.group_id
    return out


def tool_scopes(metadata: dict[str, Any]) -> frozenset[str]:
    """The agent turns that offer a plugin tool: the chat planner, and the life loop when the
    declaration says `life_loop=True` (`life_loop="only"`: the life loop alone)."""
    life_loop = metadata.get("life_loop")
    if life_loop == "only":
        return frozenset({LIFE})
    return frozenset({CHAT, LIFE}) if life_loop is True else frozenset({CHAT})


def _tool(
    host: ComponentHost, record: PluginRecord, component: ComponentInfo, scopes: frozenset[str] | None = None
) -> Tool:
    meta = component.metadata
    legacy_action = bool(meta.get("legacy_action"))
    platforms = [str(p) for p in meta.get("platforms") or []]

    cache_policy = plugin_cache.policy(meta)
    if isinstance(cache_policy, str):
        component.note = f"registered without a cache: {cache_policy}"
        cache_policy = None
    cache = plugin_cache.component_cache(record.plugin_id, component.name) if cache_policy else None
    if cache is not None:
        host.on_unregister(lambda: plugin_cache.drop(record.plugin_id, component.name))

    async def run(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
        if not component.enabled:
            return registry.error(Code.TOOL_FAILED, f"{component.name} is disabled by its plugin")
        cache_key = ""
        if cache is not None:
            stream_id = ctx.session.session_id if ctx.session is not None and cache_policy.scope == "chat" else ""
            cache_key = plugin_cache.cache_key(arguments, stream_id)
            hit, cached = plugin_cache.lookup(cache, cache_key)
            if hit:
                return registry.ok(result=cached, cached=True)
        args = dict(arguments)
        for key, value in _chat_args(ctx).items():
            if not args.get(key):
                args[key] = value
        if legacy_action:
            args["action_data"] = dict(arguments)
            args["reasoning"] = ""
        # The engine's limit for this call (it cuts the call there): the runner's work stops with it.
        timeout = ctx.timeout or get_config().chat.tool_timeout
        try:
            result = await host.ainvoke(record, component, args, timeout)
        except TimeoutError:
            return registry.error(Code.TOOL_TIMEOUT, f"{component.name} did not finish within {timeout:g}s")
        except Exception as exc:
            return registry.error(Code.TOOL_FAILED, f"{type(exc).__name__}: {exc}"[:500])
        if not isinstance(result, dict):
            result = {"content": "" if result is None else str(result)}
        if cache is not None:
            cache.put(cache_key, result, cache_policy.ttl)
        return registry.ok(result=result)

    description = str(meta.get("description") or meta.get("brief_description") or component.name)
    return registry.register_tool(
        component.name,
        f"{description} (plugin {record.plugin_id})"[:MAX_DESCRIPTION],
        run,
        parameters=parameters_schema(meta),
        available=(lambda ctx: component.enabled and ctx.session is not None and ctx.session.platform in platforms)
        if platforms
        else (lambda ctx: component.enabled),
        scopes=tool_scopes(meta) if scopes is None else scopes,
    )


def _command_outcome(result: Any, intercept: bool) -> tuple[bool, Any, bool]:
    """A plugin command's answer → (success, response, intercept): MaiBot's (success, text, intercept)
    tuple, or a bare response (the declared `intercept_message_level` then decides)."""
    if isinstance(result, list | tuple) and len(result) >= 3:
        return bool(result[0]), result[1], bool(result[2])
    return True, result, intercept


def _command(host: ComponentHost, record: PluginRecord, component: ComponentInfo) -> Command:
    meta = component.metadata
    pattern = str(meta.get("command_pattern") or "")
    compiled = re.compile(pattern) if pattern else None
    aliases = [str(a) for a in meta.get("aliases") or [] if str(a)]

    def match(text: str) -> dict[str, Any] | None:
        if compiled is not None and (m := compiled.search(text)):
            return m.groupdict()
        if any(text.startswith(a) for a in aliases):
            return {}
        return None

    async def handle(turn, text: str) -> bool:
        groups = match(text) if component.enabled else None
        if groups is None:
            return False
        session = turn.session
        message = turn.message
        hooks = plugin_events.CommandHooks(message, session, command_name=component.name, plugin_id=record.plugin_id)
        groups = await hooks.before(groups)
        if groups is None:
            turn.note(f"plugin command {record.plugin_id}.{component.name} stopped by {hooks.aborted_by}"[:500])
            return True  # as MaiBot: a command a hook stopped takes the message, and does not run
        args = {
            "text": text,
            "stream_id": session.session_id,
            "group_id": session.group_id,
            "platform": session.platform,
            "user_id": message.sender_id if message is not None else session.user_id,
            "is_local_operator": False,
            "matched_groups": groups,
        }
        if message is not None:
            from plugins.capabilities import _message

            args["message"] = _message(message, session)
        label = f"plugin command {record.plugin_id}.{component.name}"
        try:
            result = await host.ainvoke(record, component, args, get_config().chat.tool_timeout)
        except Exception as exc:
            # As MaiBot: a command that raised does not intercept; the message goes on.
            turn.note(f"{label} failed: {type(exc).__name__}: {exc}"[:500])
            success, response, intercept = False, f"{type(exc).__name__}: {exc}", False
        else:
            success, response, intercept = _command_outcome(result, bool(meta.get("intercept_message_level", 0)))
            turn.note(f"{label}: {'ok' if success else 'failed'}" + (f" ({response})" if response else "")[:500])
        return await hooks.after(groups, success=success, response=response, intercept=intercept)

    return Command(
        name=f"plugin:{record.plugin_id}:{component.name}",
        handle=handle,
        order=COMMAND_ORDER,
        before_planner=True,
        matches=lambda text: component.enabled and match(text) is not None,
    )


def _register_tool(
    host: ComponentHost, record: PluginRecord, component: ComponentInfo, *, scopes: frozenset[str] | None = None
) -> None:
    """Register a plugin tool (with `scopes` instead of its declared ones when given), or note on the
    component why it was not: an invalid name, or one already taken."""
    if not _TOOL_NAME.fullmatch(component.name):
        component.note = "a tool name must be 1–64 letters, digits, _ or -"
        return
    if registry.registry.get(component.name) is not None:
        component.note = f"the tool name {component.name} is already taken"
        return
    _tool(host, record, component, scopes)
    host.on_unregister(lambda name=component.name: registry.registry.unregister(name))


def register_components(host: ComponentHost, record: PluginRecord, *, life_only: bool = False) -> None:
    """Register the record's components. `life_only` (a cluster worker's host): only tools offered to
    the life loop, with scope "life" alone (the worker runs no chat planner, commands or chat events)."""
    for component in record.components:
        kind = component.type
        try:
            if life_only:
                if kind != "TOOL" or LIFE not in tool_scopes(component.metadata):
                    component.note = "not registered in a cluster worker (life-loop tools only)"
                    continue
                _register_tool(host, record, component, scopes=frozenset({LIFE}))
            elif kind == "TOOL":
                _register_tool(host, record, component)
            elif kind == "COMMAND":
                command = _command(host, record, component)
                registry.register_command(command)
                host.on_unregister(lambda name=command.name: registry.unregister_command(name))
            elif kind == "API":
                plugin_apis.register_api(host, record, component)
            elif kind in ("EVENT_HANDLER", "HOOK_HANDLER"):
                if why := plugin_events.register(host, record, component):
                    component.note = why
                    continue
            elif kind == "MESSAGE_GATEWAY":
                if why := gateways.register(host, record, component):
                    component.note = why
                    continue
            else:
                component.note = f"{component.kind} components are not supported by this host yet"
                continue
        except (re.error, ValueError) as exc:
            component.note = f"not registered: {exc}"
            continue
        except (TypeError, AttributeError, KeyError) as exc:
            # A declaration that is not what the SDK declares (a hostile runner's): that component only.
            component.note = f"not registered: {type(exc).__name__}: {exc}"
            continue
        component.registered = True
