"""The event and hook points chat emits, and the handlers other apps (and plugins) register for them.

Points (named as MaiBot's hook points, so plugins' `@HookHandler`s and `@EventHandler`s map onto them;
plugins.events does the mapping):

* `chat.receive.before_process` — a new message, before anything reads it. kwargs: message, session,
  text. May abort; may modify `text`.
* `chat.receive.after_process` — the same message after the first pass. Same kwargs and rights.
* `maisaka.planner.before_request` — a planner cycle, before its first model call. kwargs: session,
  messages, tool_definitions (the OpenAI request). May modify messages and tool_definitions.
* `send_service.after_send` — an outbound message handed to its adapter. kwargs: message, session.
* `on_start` / `on_stop` — the process's plugins are loaded / about to unload. No kwargs.

An aborted receive point means the message is stored but never reaches a planner or command; a
modified `text` is stored as the message's text before anything plans on it.

A handler is a sync function (kwargs, timeout) -> result, run in a worker thread of its own pool with
a timeout. *Blocking* handlers run one after the other, each seeing the kwargs the previous one left;
*observe* handlers run in the background on a copy and their results are ignored. Blocking handlers
return None (continue), or {"action": "continue" | "abort", "modified_kwargs": {...}}. A handler that
raises, times out or returns something else is recorded (`recent_failures`, the handler's `on_error`,
the log) and skipped; only with `error_policy="abort"` does its failure abort a point that may be
aborted. Order: blocking before observe, then `order` (lower first, changeable at run time with
`order_change`), then built-ins before plugins, then name.

`emit(point, **kwargs)` is sync (call it from a thread); `aemit` is its async form and costs nothing
when no handler is registered for the point.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from django.db import connections

from maibot.config import get_config

logger = logging.getLogger(__name__)


class Point(StrEnum):
    RECEIVE_BEFORE_PROCESS = "chat.receive.before_process"
    RECEIVE_AFTER_PROCESS = "chat.receive.after_process"
    PLANNER_BEFORE_REQUEST = "maisaka.planner.before_request"
    AFTER_SEND = "send_service.after_send"
    START = "on_start"
    STOP = "on_stop"


@dataclass(frozen=True)
class PointSpec:
    may_abort: bool
    modifiable: frozenset[str]  # the kwargs a blocking handler may change


SPECS: dict[str, PointSpec] = {
    Point.RECEIVE_BEFORE_PROCESS: PointSpec(True, frozenset({"text"})),
    Point.RECEIVE_AFTER_PROCESS: PointSpec(True, frozenset({"text"})),
    Point.PLANNER_BEFORE_REQUEST: PointSpec(False, frozenset({"messages", "tool_definitions"})),
    Point.AFTER_SEND: PointSpec(False, frozenset()),
    Point.START: PointSpec(False, frozenset()),
    Point.STOP: PointSpec(False, frozenset()),
}

# A handler's timeout is capped here; one that gives none gets the config's chat.tool_timeout.
MAX_TIMEOUT = 300.0
# What a background (observe) handler waits for a worker; beyond it, the call is dropped and recorded.
MAX_BACKLOG = 1000

Handle = Callable[[dict[str, Any], float], Any]


@dataclass(frozen=True)
class EventHandler:
    name: str  # unique: "plugin:<plugin id>:<component>" for plugins
    point: str
    handle: Handle
    blocking: bool = True
    order: int = 100
    timeout: float | None = None  # seconds; None: the config's chat.tool_timeout
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
_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="maibot-event")
# Observe handlers run in a pool of their own: stuck observers never delay the blocking chain.
_observers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="maibot-event-observe")
# emit_background's emits wait on _pool: they run in a pool of their own, so they never starve it.
_background = ThreadPoolExecutor(max_workers=2, thread_name_prefix="maibot-event-bg")
_backlog = 0
_backlog_lock = threading.Lock()


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
    if handler.timeout and handler.timeout > 0:
        return min(MAX_TIMEOUT, handler.timeout)
    return get_config().chat.tool_timeout


def _call(handler: EventHandler, kwargs: dict[str, Any], timeout: float) -> Any:
    try:
        return handler.handle(kwargs, timeout)
    finally:
        connections.close_all()  # this pool thread's own connections, if the handler used the ORM


def _run_blocking(handler: EventHandler, kwargs: dict[str, Any]) -> Any:
    timeout = _timeout(handler)
    future = _pool.submit(_call, handler, dict(kwargs), timeout)
    try:
        # The handler gets `timeout` itself (a plugin's call is cut there); the grace covers the hop.
        return future.result(timeout=timeout + 2.0)
    except FutureTimeout:
        if future.done():
            return future.result()  # the handler's own TimeoutError (e.g. a plugin call's): re-raised as is
        future.cancel()
        raise TimeoutError(f"did not finish within {timeout:g}s") from None


def emit(point: str, **kwargs: Any) -> Emission:
    """Run the point's handlers (sync; blocking ones in order, observe ones in the background)."""
    spec = SPECS.get(point)
    if spec is None:
        raise ValueError(f"{point!r} is not a point this host emits")
    emission = Emission(point=point, kwargs=dict(kwargs))
    for handler in handlers(point):
        if not handler.blocking:
            _observe(handler, point, dict(emission.kwargs))
            continue
        if emission.aborted:
            continue
        try:
            result = _run_blocking(handler, emission.kwargs)
        except Exception as exc:
            _fail(handler, point, f"{type(exc).__name__}: {exc}", emission, exc)
            if handler.error_policy == "abort" and spec.may_abort:
                emission.aborted, emission.aborted_by = True, handler.name
            continue
        _apply(handler, spec, result, emission)
    return emission


def _apply(handler: EventHandler, spec: PointSpec, result: Any, emission: Emission) -> None:
    if result is None:
        return
    if not isinstance(result, dict):
        _fail(handler, emission.point, f"returned {type(result).__name__}, not a dict or None", emission)
        return
    modified = result.get("modified_kwargs")
    if isinstance(modified, dict):
        for key in spec.modifiable:
            if key in modified:
                emission.kwargs[key] = modified[key]
    if str(result.get("action") or "continue") == "abort":
        if spec.may_abort:
            emission.aborted, emission.aborted_by = True, handler.name
        else:
            _fail(handler, emission.point, "asked to abort a point that cannot be aborted", emission)


def _observe(handler: EventHandler, point: str, kwargs: dict[str, Any]) -> None:
    global _backlog
    with _backlog_lock:
        if _backlog >= MAX_BACKLOG:
            _fail(handler, point, f"dropped: {MAX_BACKLOG} background handler calls are already waiting")
            return
        _backlog += 1

    def run() -> None:
        global _backlog
        try:
            _call(handler, kwargs, _timeout(handler))
        except Exception as exc:
            _fail(handler, point, f"{type(exc).__name__}: {exc}", exc=exc)
        finally:
            with _backlog_lock:
                _backlog -= 1

    _observers.submit(run)


def emit_background(point: str, make_kwargs: Callable[[], list[dict[str, Any]]]) -> None:
    """For points nobody may change (after send): build the kwargs (e.g. read rows) and emit them in a
    worker thread, so the caller never waits. Nothing happens when the point has no handler."""
    if not has_handlers(point):
        return

    def run() -> None:
        try:
            for kwargs in make_kwargs():
                emit(point, **kwargs)
        except Exception:
            logger.exception("emitting %s failed", point)
        finally:
            connections.close_all()

    _background.submit(run)


async def aemit(point: str, **kwargs: Any) -> Emission:
    """emit() from async code: free when the point has no handler, else run in a thread."""
    if not has_handlers(point):
        return Emission(point=point, kwargs=dict(kwargs))
    return await asyncio.to_thread(emit, point, **kwargs)
