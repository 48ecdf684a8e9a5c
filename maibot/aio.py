"""Small asyncio helpers shared by the long-running loops."""

from __future__ import annotations

import asyncio


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
