"""Small asyncio helpers shared by the long-running loops, the one way async code reaches the
database (`db`), and the process's one private event loop (`background_loop`, `submit`).

Invariant: code that is not itself running on an event loop (a sync view, a management command, a
watcher thread) and needs to run a coroutine in the background uses `background_loop()`; no other module
starts a thread with an event loop of its own. The loop belongs to the process that made it: a forked
child gets a new one on first use."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, close_old_connections, connection

P = ParamSpec("P")
R = TypeVar("R")


def db(fn: Callable[P, R], *, executor: Executor | None = None, fresh: bool = False) -> Callable[P, Awaitable[R]]:
    """`fn`, sync ORM work, as a coroutine function: the one way async code hops to a database thread.

    By default it runs in the caller's DB thread (asgiref's thread-sensitive hop): inside sync code
    that awaits async code, that code's own thread, connection and transaction; elsewhere the process's
    one shared DB thread, whose connection the chat runtimes' queries take in turn. `executor`: that
    executor's threads instead (long-lived ones, each with its own connection), for work that must not
    queue behind the chat runtimes; a DatabaseError closes that thread's connection, so a broken one
    never poisons its later calls. `fresh`:
    connections that broke or outlived CONN_MAX_AGE are closed before and after the call (Channels'
    rule for consumers; with CONN_MAX_AGE=0 a new connection per call), for code that hops now and
    then from a long-lived task and must recover from a database restart by itself."""
    if fresh:
        inner = fn

        @wraps(inner)
        def fn(*args: P.args, **kwargs: P.kwargs) -> R:
            close_old_connections()
            try:
                return inner(*args, **kwargs)
            finally:
                close_old_connections()

    if executor is not None:
        inner_call = fn

        @wraps(inner_call)
        def fn(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return inner_call(*args, **kwargs)
            except DatabaseError:
                connection.close()
                raise

    return sync_to_async(fn, thread_sensitive=executor is None, executor=executor)


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait for `event` at most `timeout` seconds; True if it was set.

    Not `asyncio.wait_for(event.wait(), timeout)`: on Python 3.11 that swallows a cancellation arriving
    while the event is being set (CPython gh-86296), and a loop built on it then runs on after its task
    was cancelled, so whoever awaits the task at shutdown waits for ever. `asyncio.timeout` keeps it."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()
_pending: set[concurrent.futures.Future] = set()  # submitted work in flight, referenced until done


def background_loop() -> asyncio.AbstractEventLoop:
    """This process's one private event loop, run by a daemon thread started on first use (again in a
    forked child). Work on it must not block: blocking calls hop to threads (`db`, `to_thread`)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=run, name="maibot-background", daemon=True).start()
            started.wait()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def submit(coro: Coroutine[Any, Any, R]) -> concurrent.futures.Future[R]:
    """Run `coro` on the background loop; the returned future is kept referenced until it is done."""
    future = asyncio.run_coroutine_threadsafe(coro, background_loop())
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    return future
