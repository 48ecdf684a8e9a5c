"""Small asyncio helpers shared by the long-running loops, and the one way async code reaches the
database (`db`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from functools import wraps
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")


def db(fn: Callable[P, R], *, executor: Executor | None = None, fresh: bool = False) -> Callable[P, Awaitable[R]]:
    """`fn`, sync ORM work, as a coroutine function: the one way async code hops to a database thread.

    By default it runs in the caller's DB thread (asgiref's thread-sensitive hop): inside sync code
    that awaits async code, that code's own thread, connection and transaction; elsewhere the process's
    one shared DB thread, whose connection the chat runtimes' queries take in turn. `executor`: that
    executor's threads instead, for work that must not queue behind the chat runtimes. `fresh`:
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
