"""Plugins' `@EventHandler` and `@HookHandler` components registered as handlers of chat's event points
(chat.events), and the start / stop events of the plugin host.

* `@HookHandler("<hook>")` subscribes to the point of that name when chat emits it
  (`chat.receive.before_process`, `chat.receive.after_process`, `chat.command.before_execute`,
  `chat.command.after_execute` (around a plugin's command: CommandHooks), `maisaka.planner.before_request`,
  `maisaka.planner.after_response`, `maisaka.replyer.before_request`, `maisaka.replyer.after_response`,
  `send_service.before_send`, `send_service.after_send`; payloads of the newer ones:
  plugins.hook_payloads). mode BLOCKING runs in the chain (it may return {"action": "abort"} where
  the point allows it, and {"modified_kwargs": ...}); OBSERVE runs in the background. order EARLY /
  NORMAL / LATE → 50 / 100 / 150; timeout_ms, at most chat.tool_timeout (0: that); error_policy as
  the SDK says.
  A hook point this host does not emit (e.g. `maisaka.replyer.before_model_request`) is listed with a note,
  never a reason to refuse the plugin.
* `@EventHandler(event_type=...)`: ON_START / ON_STOP → on_start / on_stop; ON_MESSAGE_PRE_PROCESS →
  chat.receive.before_process; ON_MESSAGE → chat.receive.after_process; ON_PLAN →
  maisaka.planner.before_request; POST_SEND_PRE_PROCESS → send_service.before_send; POST_SEND /
  AFTER_SEND → send_service.after_send. POST_LLM and AFTER_LLM are not emitted here (noted).
  `intercept_message=True` runs it in the chain, where it may stop the message ({"intercepted": true},
  {"continue_processing": false}, or MaiBot's (success, continue_processing, …) tuple); otherwise it runs in the
  background. order = 100 - weight (a higher weight runs first, as in MaiBot).

What a handler gets: on the receive points and after send, `message` (the message as the SDK's dict,
its `processed_plain_text` the text as the chain left it; after send also `sent`: true); around a
command, `message`, `command_name`, `plugin_id`, `matched_groups` (after it also `success`, `response`,
`intercept_message_level`, `continue_process`); before planning, `messages` and
`tool_definitions` (the OpenAI-format request), `stream_id`, `session_id`; on start / stop nothing.
A plugin changes a message's text by returning `modified_kwargs={"message": {..., "processed_plain_text":
"new"}}`; a modification of the wrong shape is ignored and recorded as the handler's failure. Every
call goes through `ComponentHost.ainvoke` (awaited: no thread waits for a plugin), with its timeout;
a failure is recorded on the plugin (admin: recent errors) and in chat.events.recent_failures, and
never breaks the message path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from chat import events
from chat.events import EventHandler, Point
from core.aio import db
from plugins import hook_payloads

if TYPE_CHECKING:
    from plugins.records import ComponentHost, ComponentInfo, PluginRecord

logger = logging.getLogger(__name__)

EVENT_TYPE_POINTS: dict[str, str] = {
    "on_start": Point.START,
    "on_stop": Point.STOP,
    "on_message_pre_process": Point.RECEIVE_BEFORE_PROCESS,
    "on_message": Point.RECEIVE_AFTER_PROCESS,
    "on_plan": Point.PLANNER_BEFORE_REQUEST,
    "post_send_pre_process": Point.BEFORE_SEND,
    "post_send": Point.AFTER_SEND,
    "after_send": Point.AFTER_SEND,
}
HOOK_ORDER = {"early": 50, "normal": 100, "late": 150}
MESSAGE_POINTS = {Point.RECEIVE_BEFORE_PROCESS, Point.RECEIVE_AFTER_PROCESS, Point.AFTER_SEND}
# What a command hook's handler gets besides `message` (MaiBot's names and shapes).
COMMAND_KWARGS = {
    Point.COMMAND_BEFORE_EXECUTE: ("command_name", "plugin_id", "matched_groups"),
    Point.COMMAND_AFTER_EXECUTE: (
        "command_name",
        "plugin_id",
        "matched_groups",
        "success",
        "response",
        "intercept_message_level",
        "continue_process",
    ),
}
COMMAND_POINTS = set(COMMAND_KWARGS)


def handler_name(record: PluginRecord, component: ComponentInfo) -> str:
    return f"plugin:{record.plugin_id}:{component.name}"


def _plugin_args(point: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """chat's kwargs (model objects) → what a MaiBot plugin's handler receives (JSON-able dicts)."""
    if point in MESSAGE_POINTS or point in COMMAND_POINTS:
        from plugins.capabilities import _message

        message = _message(kwargs["message"], kwargs["session"])
        if "text" in kwargs:
            message["processed_plain_text"] = message["display_message"] = kwargs["text"]
        if point == Point.AFTER_SEND:
            return {"message": message, "sent": True}  # emitted only for messages handed over
        if point in COMMAND_POINTS:
            return {"message": message, **{k: kwargs[k] for k in COMMAND_KWARGS[point] if k in kwargs}}
        return {"message": message}
    if point in hook_payloads.POINTS:
        return hook_payloads.args(point, kwargs)
    if point == Point.PLANNER_BEFORE_REQUEST:
        session = kwargs.get("session")
        stream_id = session.session_id if session is not None else ""
        return {
            "messages": kwargs.get("messages", []),
            "tool_definitions": kwargs.get("tool_definitions", []),
            "stream_id": stream_id,
            "session_id": stream_id,
        }
    return {}


def _chat_result(point: str, result: Any, *, event_handler: bool) -> dict[str, Any] | None:
    """A plugin handler's answer → chat.events' {"action", "modified_kwargs"} (None: continue)."""
    if event_handler and (not isinstance(result, dict) or "action" not in result):
        stop = False
        if isinstance(result, dict):
            stop = bool(result.get("intercepted")) or result.get("continue_processing") is False
        elif isinstance(result, list | tuple) and len(result) >= 2:
            stop = result[1] is False
        return {"action": "abort"} if stop and events.SPECS[point].may_abort else None
    if not isinstance(result, dict):
        return None  # a hook handler that returns nothing (or something else) lets the chain go on
    action = "abort" if str(result.get("action") or "continue") == "abort" else "continue"
    out: dict[str, Any] = {"action": action}
    modified = result.get("modified_kwargs")
    if isinstance(modified, dict):
        out["modified_kwargs"] = _changed_kwargs(point, modified)
    elif modified is not None:
        out["modified_kwargs"] = modified  # not a dict: chat.events records it as malformed
    return out


async def _payload_changes(point: str, modified: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """The answer's changes at one of plugins.hook_payloads' points, a new raw_message read (in a
    thread: it may store media)."""
    changed = hook_payloads.changes(point, modified, sent)
    if "raw_message" in changed:
        changed["segments"] = await db(hook_payloads.outbound_segments)(changed.pop("raw_message"))
    return changed


def _changed_kwargs(point: str, modified: dict[str, Any]) -> dict[str, Any]:
    """A plugin's modified_kwargs → chat's names. Values go on as given: chat.events checks their types
    and records a malformed one as the handler's failure."""
    changed: dict[str, Any] = {}
    if point in MESSAGE_POINTS and "message" in modified:
        message = modified["message"]
        changed["text"] = message.get("processed_plain_text") if isinstance(message, dict) else message
    elif point == Point.PLANNER_BEFORE_REQUEST:
        for key in ("messages", "tool_definitions"):
            value = modified.get(key)
            if isinstance(value, list) and not all(isinstance(v, dict) for v in value):
                value = None  # a list of something else than messages: recorded as malformed
            if key in modified:
                changed[key] = value
    elif point in COMMAND_POINTS:
        changed = {k: v for k, v in modified.items() if k in events.SPECS[point].modifiable}
    elif point in hook_payloads.POINTS:
        changed = dict(modified)  # as given: handle() turns them into chat's (plugins.hook_payloads)
    return changed


def _handler(host: ComponentHost, record: PluginRecord, component: ComponentInfo) -> EventHandler | str:
    """The chat handler for a component, or why it cannot be one."""
    meta = component.metadata
    event_handler = component.type == "EVENT_HANDLER"
    if event_handler:
        event_type = str(meta.get("event_type") or "on_message")
        point = EVENT_TYPE_POINTS.get(event_type)
        if point is None:
            return f"the event {event_type} is not emitted by this host"
        blocking = bool(meta.get("intercept_message"))
        order = 100 - int(meta.get("weight") or 0)
        timeout = None
        error_policy = "skip"
    else:
        point = str(meta.get("hook") or "")
        if point not in events.SPECS or point in (Point.START, Point.STOP):
            return f"the hook {point} is not emitted by this host"
        blocking = str(meta.get("mode") or "blocking") == "blocking"
        order = HOOK_ORDER.get(str(meta.get("order") or "normal"), 100)
        timeout_ms = int(meta.get("timeout_ms") or 0)
        timeout = timeout_ms / 1000 if timeout_ms > 0 else None
        error_policy = str(meta.get("error_policy") or "skip")

    async def handle(kwargs: dict[str, Any], seconds: float) -> Any:
        args = _plugin_args(point, kwargs)
        try:
            result = await host.ainvoke(record, component, args, seconds)
        except Exception as exc:
            exc.maibot_recorded = True  # host.invoke has recorded it on the plugin already
            raise
        answer = _chat_result(point, result, event_handler=event_handler)
        if point in hook_payloads.POINTS and answer and isinstance(answer.get("modified_kwargs"), dict):
            answer["modified_kwargs"] = await _payload_changes(point, answer["modified_kwargs"], args)
        return answer

    def on_error(error: str, exc: BaseException | None) -> None:
        if not getattr(exc, "maibot_recorded", False):
            record.error(f"{component.kind} {component.name}: {error}")

    return EventHandler(
        name=handler_name(record, component),
        point=point,
        handle=handle,
        blocking=blocking,
        order=order,
        timeout=timeout,
        error_policy=error_policy,
        builtin=False,
        on_error=on_error,
    )


def register(host: ComponentHost, record: PluginRecord, component: ComponentInfo) -> str:
    """Register an EVENT_HANDLER / HOOK_HANDLER component; returns "" or why it is not registered."""
    handler = _handler(host, record, component)
    if isinstance(handler, str):
        return handler
    try:
        events.register_handler(handler)
    except ValueError as exc:
        return str(exc)
    host.on_unregister(lambda: events.unregister_handler(handler.name))
    return ""


def emit_start() -> None:
    """on_start: the process's plugins are loaded (their handlers run, blocking ones in order)."""
    if events.has_handlers(Point.START):
        events.emit(Point.START)


def emit_stop() -> None:
    """on_stop: the process's plugins are about to unload."""
    if events.has_handlers(Point.STOP):
        events.emit(Point.STOP)


class CommandHooks:
    """`chat.command.before_execute` / `chat.command.after_execute` around one run of a plugin's command,
    with MaiBot's kwargs. Costs nothing when no handler is registered; a command with no message to
    show (the offline planner's) is not announced."""

    def __init__(self, message: Any, session: Any, *, command_name: str, plugin_id: str) -> None:
        self.message = message
        self.session = session
        self.command_name = command_name
        self.plugin_id = plugin_id
        self.aborted_by = ""

    def _kwargs(self, groups: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "message": self.message,
            "session": self.session,
            "command_name": self.command_name,
            "plugin_id": self.plugin_id,
            "matched_groups": dict(groups),
            **extra,
        }

    async def before(self, groups: dict[str, Any]) -> dict[str, Any] | None:
        """The matched groups the command runs with (a handler may change them); None: a handler
        stopped the command (`aborted_by` says which)."""
        if self.message is None or not events.has_handlers(Point.COMMAND_BEFORE_EXECUTE):
            return groups
        emission = await events.aemit(Point.COMMAND_BEFORE_EXECUTE, **self._kwargs(groups))
        if emission.aborted:
            self.aborted_by = emission.aborted_by
            return None
        return emission.kwargs["matched_groups"]

    async def after(self, groups: dict[str, Any], *, success: bool, response: Any, intercept: bool) -> bool:
        """Whether the command took the message (MaiBot: not `continue_process`, which a handler may change)."""
        if self.message is None or not events.has_handlers(Point.COMMAND_AFTER_EXECUTE):
            return intercept
        kwargs = self._kwargs(
            groups,
            success=success,
            response=None if response is None else str(response),
            intercept_message_level=int(intercept),
            continue_process=not intercept,
        )
        emission = await events.aemit(Point.COMMAND_AFTER_EXECUTE, **kwargs)
        return not emission.kwargs["continue_process"]
