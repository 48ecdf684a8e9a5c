"""The event and hook points chat emits, and the handlers other apps (and plugins) register for them.

Points (named as MaiBot's hook points, so plugins' `@HookHandler`s and `@EventHandler`s map onto them;
plugins.events does the mapping):

* `chat.receive.before_process` — a new message, before anything reads it. kwargs: message, session,
  text. May abort; may modify `text`.
* `chat.receive.after_process` — the same message after the first pass. Same kwargs and rights.
* `maisaka.planner.before_request` — a planner cycle, before its first model call. kwargs: session,
  messages, tool_definitions (the OpenAI request). May modify messages and tool_definitions.
* `chat.command.before_execute` — a plugin's command matched a message, before it runs. kwargs: message,
  session, command_name, plugin_id, matched_groups. May abort (the command does not run and the message
  goes no further, as in MaiBot); may modify matched_groups.
* `chat.command.after_execute` — the command ran. kwargs as before, and success, response,
  continue_process (False: the command took the message). May modify success, response and
  continue_process.
* `maisaka.planner.after_response` — each planner model answer about to be acted on. kwargs: session,
  response, tool_calls (MaiBot's `{"id", "function": {"name", "arguments"}}`), token counts. May
  modify response and tool_calls (chat.planner.hooks).
* `maisaka.replyer.before_request` / `maisaka.replyer.after_response` — a `reply` call of the planner,
  before it is carried out: the planner is this host's replyer (chat.planner.hooks). kwargs: session,
  reply_message_id, reply_reason, reply_tool_args, and after_response the reply's text as `response`.
  after_response may modify response ("" withdraws the reply), retry and retry_reason.
* `send_service.before_send` — an outbound message stored, before the outbox may hand it over. kwargs:
  message, session, text, segments, reply_message_id. May abort (the message fails, saying which
  handler stopped it); may modify text and segments (chat.send_hooks).
* `send_service.after_send` — an outbound message handed to its adapter. kwargs: message, session.
* `on_start` / `on_stop` — the process's plugins are loaded / about to unload. No kwargs.

An aborted receive point means the message is stored but never reaches a planner or command; a
modified `text` is stored as the message's text before anything plans on it.

A handler is a coroutine function (kwargs, timeout) -> result. No thread waits for one: blocking
handlers are awaited on the emitter's event loop, observe handlers and background emits run on this
module's own event loop (one thread, however many calls wait), so a slow handler costs the chat that
emitted it its time and nothing else. A handler must honour `timeout` (a plugin's call is cut there
and cancelled in its runner) and must not block its loop (ORM work goes through core.aio.db); the
chain stops waiting for it `GRACE` seconds after its timeout in any case. Its timeout is its own
(`EventHandler.timeout`) but never more than the config's `chat.tool_timeout`, which is also the
default. What one chat may have running in the background (observe calls, after-send emits) is
bounded per chat (`MAX_BACKLOG_PER_CHAT`) as well as in all (`MAX_BACKLOG`): beyond it a call is
dropped and recorded, so a chat flooding slow handlers never takes the room other chats need.

*Blocking* handlers run one after the other, each seeing the kwargs the previous one left; *observe*
handlers run in the background on a copy and their results are ignored. Blocking handlers
return None (continue), or {"action": "continue" | "abort", "modified_kwargs": {...}}. A handler that
raises, times out or returns something else is recorded (`recent_failures`, the handler's `on_error`,
the log) and skipped; only with `error_policy="abort"` does its failure abort a point that may be
aborted. Order: blocking before observe, then `order` (lower first, changeable at run time with
`order_change`), then built-ins before plugins, then name.

`aemit(point, **kwargs)` runs a point from async code and costs nothing when no handler is registered
for it; `emit` is its form for a thread (it waits); `emit_background` for points nobody may change.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from django.db import connections

from core import aio
from core.config import get_config

logger = logging.getLogger(__name__)


class Point(StrEnum):
    RECEIVE_BEFORE_PROCESS = "chat.receive.before_process"
    RECEIVE_AFTER_PROCESS = "chat.receive.after_process"
    PLANNER_BEFORE_REQUEST = "maisaka.planner.before_request"
    COMMAND_BEFORE_EXECUTE = "chat.command.before_execute"
    COMMAND_AFTER_EXECUTE = "chat.command.after_execute"
    PLANNER_AFTER_RESPONSE = "maisaka.planner.after_response"
    REPLYER_BEFORE_REQUEST = "maisaka.replyer.before_request"
    REPLYER_AFTER_RESPONSE = "maisaka.replyer.after_response"
    BEFORE_SEND = "send_service.before_send"
    AFTER_SEND = "send_service.after_send"
    START = "on_start"
    STOP = "on_stop"


@dataclass(frozen=True)
class PointSpec:
    may_abort: bool
    # The kwargs a blocking handler may change, with the types a new value must have (another type is
    # a malformed modification: ignored, and recorded as the handler's failure).
    modifiable: dict[str, tuple[type, ...]]
    # (key, new value) → why that value is refused ("" when it is not), beyond its type.
    check: Callable[[str, Any], str] | None = None


def _outbound_check(key: str, value: Any) -> str:
    """before_send's changes: a message with something to send, in segments we can store."""
    if key == "text":
        return "" if value.strip() else "is blank"
    if not any(isinstance(s, dict) and s.get("type") != "reply" for s in value):
        return "leaves nothing to send"
    for i, seg in enumerate(value):
        if not isinstance(seg, dict) or not isinstance(seg.get("type"), str) or "data" not in seg:
            return f"[{i}] is not an object with a type and data"
    return ""


def _tool_calls_check(key: str, value: Any) -> str:
    """planner after_response's tool_calls: MaiBot's `{"id", "function": {"name", "arguments"}}`."""
    if key != "tool_calls":
        return ""
    for i, call in enumerate(value):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return f"[{i}] is not a tool call with a function name"
        if not isinstance(call.get("id", call.get("call_id")), str):
            return f"[{i}] has no id"
        if not isinstance(function.get("arguments", {}), dict | str):
            return f"[{i}]'s arguments are not an object"
    return ""


_TEXT = {"text": (str,)}
SPECS: dict[str, PointSpec] = {
    Point.RECEIVE_BEFORE_PROCESS: PointSpec(True, _TEXT),
    Point.RECEIVE_AFTER_PROCESS: PointSpec(True, _TEXT),
    Point.PLANNER_BEFORE_REQUEST: PointSpec(False, {"messages": (list,), "tool_definitions": (list,)}),
    Point.COMMAND_BEFORE_EXECUTE: PointSpec(True, {"matched_groups": (dict,)}),
    Point.COMMAND_AFTER_EXECUTE: PointSpec(
        False, {"success": (bool,), "response": (str, type(None)), "continue_process": (bool,)}
    ),
    Point.PLANNER_AFTER_RESPONSE: PointSpec(False, {"response": (str,), "tool_calls": (list,)}, _tool_calls_check),
    # Nothing to change: no replyer prompt follows here (the planner wrote the reply's text already).
    Point.REPLYER_BEFORE_REQUEST: PointSpec(False, {}),
    Point.REPLYER_AFTER_RESPONSE: PointSpec(False, {"response": (str,), "retry": (bool,), "retry_reason": (str,)}),
    Point.BEFORE_SEND: PointSpec(True, {"text": (str,), "segments": (list,)}, _outbound_check),
    Point.AFTER_SEND: PointSpec(False, {}),
    Point.START: PointSpec(False, {}),
    Point.STOP: PointSpec(False, {}),
}

# Seconds the chain waits for a handler beyond its timeout (which the handler itself enforces: a
# plugin's call is cut at it, then cancelled in its runner) before it goes on without it.
GRACE = 5.0
# Background (observe) calls and background emits waiting or running, in all and per chat; beyond
# them a call is dropped and recorded.
MAX_BACKLOG = 1000
MAX_BACKLOG_PER_CHAT = 50

Handle = Callable[[dict[str, Any], float], Awaitable[Any]]


@dataclass(frozen=True)
class EventHandler:
    name: str  # unique: "plugin:<plugin id>:<component>" for plugins
    point: str
    handle: Handle
    blocking: bool = True
    order: int = 100
    timeout: float | None = None  # seconds, at most the config's chat.tool_timeout (None: that)
    error_policy: str = "skip"  # "skip" | "log" | "abort"
    builtin: bool = True
    # Told of each failure (its text, and the exception when there was one), e.g. to record it on a plugin.
    on_error: Callable[[str, BaseException | None], None] | None = None

    def sort_key(self) -> tuple:
        return (not self.blocking, self.order, not self.builtin, self.name)


@dataclass
class Emission:
    """What became of one emit: the kwargs as the blocking handlers left them, whether one aborted."""

    point: str
    kwargs: dict[str, Any]
    aborted: bool = False
    aborted_by: str = ""
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Failure:
    at: float
    point: str
    handler: str
    error: str


_handlers: dict[str, EventHandler] = {}
_lock = threading.Lock()
recent_failures: deque[Failure] = deque(maxlen=200)
# emit_background's kwargs are built (rows read) in these threads; the emits themselves run on the
# process's background loop (core.aio).
_background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="maibot-event-bg")
_backlog: dict[Hashable, int] = {}  # background calls waiting or running, by chat
_backlog_total = 0
_backlog_lock = threading.Lock()


def _in_background(coro: Coroutine[Any, Any, Any], chat: Hashable) -> concurrent.futures.Future:
    """Run `coro` on the background loop; the backlog slot it took for `chat` is released when it ends."""
    future = aio.submit(coro)
    future.add_done_callback(lambda _done: _release(chat))
    return future


def _chat_of(kwargs: dict[str, Any]) -> Hashable:
    """Whose backlog a background call counts in: the chat of its `session` kwarg (None: no chat)."""
    session = kwargs.get("session")
    key = getattr(session, "pk", session)
    return key if isinstance(key, Hashable) else id(key)


def _admit(chat: Hashable) -> str:
    """Take a backlog slot for `chat`; "" when taken, else why not."""
    global _backlog_total
    with _backlog_lock:
        if _backlog.get(chat, 0) >= MAX_BACKLOG_PER_CHAT:
            return f"dropped: this chat has {MAX_BACKLOG_PER_CHAT} background handler calls waiting already"
        if _backlog_total >= MAX_BACKLOG:
            return f"dropped: {MAX_BACKLOG} background handler calls are already waiting"
        _backlog[chat] = _backlog.get(chat, 0) + 1
        _backlog_total += 1
        return ""


def _release(chat: Hashable) -> None:
    global _backlog_total
    with _backlog_lock:
        left = _backlog.get(chat, 0) - 1
        if left > 0:
            _backlog[chat] = left
        else:
            _backlog.pop(chat, None)
        _backlog_total -= 1


def register_handler(handler: EventHandler) -> EventHandler:
    if handler.point not in SPECS:
        raise ValueError(f"{handler.point!r} is not a point this host emits")
    if handler.error_policy == "abort" and not SPECS[handler.point].may_abort:
        raise ValueError(f"{handler.point} cannot be aborted, so error_policy=abort is refused")
    global _handlers
    with _lock:
        if handler.name in _handlers:
            raise ValueError(f"event handler {handler.name!r} is already registered")
        _handlers = {**_handlers, handler.name: handler}
    return handler


def unregister_handler(name: str) -> bool:
    global _handlers
    with _lock:
        if name not in _handlers:
            return False
        _handlers = {k: v for k, v in _handlers.items() if k != name}
    return True


def order_change(name: str, order: int) -> bool:
    """Move a handler within its point's order (lower runs first); False when there is none by that name."""
    global _handlers
    with _lock:
        handler = _handlers.get(name)
        if handler is None:
            return False
        _handlers = {**_handlers, name: replace(handler, order=int(order))}
    return True


def handlers(point: str | None = None) -> list[EventHandler]:
    """The handlers of `point` (all: None) in the order they run."""
    found = [h for h in _handlers.values() if point is None or h.point == point]
    return sorted(found, key=lambda h: (h.point, *h.sort_key()))


def has_handlers(point: str) -> bool:
    return any(h.point == point for h in _handlers.values())


def _fail(
    handler: EventHandler,
    point: str,
    error: str,
    emission: Emission | None = None,
    exc: BaseException | None = None,
) -> None:
    text = f"{handler.name} on {point}: {error}"[:500]
    recent_failures.append(Failure(at=time.time(), point=point, handler=handler.name, error=error[:500]))
    if emission is not None:
        emission.failures.append(text)
    logger.warning("event handler failed: %s", text)
    if handler.on_error is not None:
        try:
            handler.on_error(error[:500], exc)
        except Exception:
            logger.exception("recording the failure of event handler %s failed", handler.name)


def _timeout(handler: EventHandler) -> float:
    limit = get_config().chat.tool_timeout
    if handler.timeout and handler.timeout > 0:
        return min(limit, handler.timeout)
    return limit


async def _run(handler: EventHandler, kwargs: dict[str, Any]) -> Any:
    """Await one handler with its timeout (TimeoutError when the chain stops waiting for it)."""
    timeout = _timeout(handler)
    deadline = asyncio.timeout(timeout + GRACE)
    try:
        async with deadline:
            return await handler.handle(dict(kwargs), timeout)
    except TimeoutError:
        if deadline.expired():
            raise TimeoutError(f"did not finish within {timeout:g}s") from None
        raise  # the handler's own (e.g. a plugin call's PluginCallTimeout): as it is


async def aemit(point: str, **kwargs: Any) -> Emission:
    """Run the point's handlers: blocking ones in order on this loop, observe ones in the background.
    Free when the point has no handler."""
    return await _emit(point, kwargs, [])


async def _emit(point: str, kwargs: dict[str, Any], observers: list[concurrent.futures.Future]) -> Emission:
    """aemit(), adding the background calls it started to `observers`."""
    spec = SPECS.get(point)
    if spec is None:
        raise ValueError(f"{point!r} is not a point this host emits")
    emission = Emission(point=point, kwargs=dict(kwargs))
    for handler in handlers(point):
        if not handler.blocking:
            if (started := _observe(handler, point, dict(emission.kwargs))) is not None:
                observers.append(started)
            continue
        if emission.aborted:
            continue
        try:
            result = await _run(handler, emission.kwargs)
        except Exception as exc:
            _fail(handler, point, f"{type(exc).__name__}: {exc}", emission, exc)
            if handler.error_policy == "abort" and spec.may_abort:
                emission.aborted, emission.aborted_by = True, handler.name
            continue
        _apply(handler, spec, result, emission)
    return emission


def emit(point: str, **kwargs: Any) -> Emission:
    """Run the point's handlers from a thread (never from an event loop's) and wait for all of them,
    observe ones too: when it returns, every handler has had its turn (on_start, on_stop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return aio.submit(_emit_and_wait(point, kwargs)).result()
    raise RuntimeError("emit() would block this event loop: await aemit() instead")


async def _emit_and_wait(point: str, kwargs: dict[str, Any]) -> Emission:
    observers: list[concurrent.futures.Future] = []
    emission = await _emit(point, kwargs, observers)
    await asyncio.gather(*(asyncio.wrap_future(f) for f in observers), return_exceptions=True)
    return emission


def _apply(handler: EventHandler, spec: PointSpec, result: Any, emission: Emission) -> None:
    if result is None:
        return
    if not isinstance(result, dict):
        _fail(handler, emission.point, f"returned {type(result).__name__}, not a dict or None", emission)
        return
    modified = result.get("modified_kwargs")
    if modified is not None and not isinstance(modified, dict):
        _fail(handler, emission.point, f"modified_kwargs is {type(modified).__name__}, not a dict; ignored", emission)
    elif modified:
        for key, types in spec.modifiable.items():
            if key not in modified:
                continue
            value = modified[key]
            problem = "" if isinstance(value, types) else f"is {type(value).__name__}"
            if not problem and spec.check is not None:
                problem = spec.check(key, value)
            if problem:
                _fail(handler, emission.point, f"modified_kwargs[{key!r}] {problem}; ignored", emission)
            else:
                emission.kwargs[key] = value
    if str(result.get("action") or "continue") == "abort":
        if spec.may_abort:
            emission.aborted, emission.aborted_by = True, handler.name
        else:
            _fail(handler, emission.point, "asked to abort a point that cannot be aborted", emission)


def _observe(handler: EventHandler, point: str, kwargs: dict[str, Any]) -> concurrent.futures.Future | None:
    """Start an observe handler's call in the background (None: dropped, and recorded)."""
    chat = _chat_of(kwargs)
    if why := _admit(chat):
        _fail(handler, point, why)
        return None

    async def run() -> None:
        try:
            await _run(handler, kwargs)
        except Exception as exc:
            _fail(handler, point, f"{type(exc).__name__}: {exc}", exc=exc)

    return _in_background(run(), chat)


def run_background(coro: Coroutine[Any, Any, Any], chat: Hashable) -> str:
    """Run `coro` on the background loop within `chat`'s backlog; "" when started, else why not (then
    `coro` is closed unrun)."""
    if why := _admit(chat):
        coro.close()
        return why
    _in_background(coro, chat)
    return ""


def emit_background(point: str, make_kwargs: Callable[[], list[dict[str, Any]]]) -> None:
    """For points nobody may change (after send): build the kwargs (e.g. read rows) in a worker thread
    and emit each in the background, so the caller never waits. Nothing happens when the point has no
    handler."""
    if not has_handlers(point):
        return

    async def emit_one(kwargs: dict[str, Any]) -> None:
        try:
            await aemit(point, **kwargs)
        except Exception:
            logger.exception("emitting %s failed", point)

    def run() -> None:
        try:
            for kwargs in make_kwargs():
                chat = _chat_of(kwargs)
                if why := _admit(chat):
                    for handler in handlers(point):
                        _fail(handler, point, why)
                    continue
                _in_background(emit_one(kwargs), chat)
        except Exception:
            logger.exception("emitting %s failed", point)
        finally:
            connections.close_all()

    _background.submit(run)
