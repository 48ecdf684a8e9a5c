"""core.aio.wait_event: a cancellation never gets lost, even when the event is set at that moment."""

from __future__ import annotations

import asyncio

import pytest

from core.aio import wait_event


async def test_wait_event_answers_set_or_timed_out():
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 10) is True


async def test_a_cancellation_arriving_as_the_event_is_set_still_cancels():
    event = asyncio.Event()
    waiting = asyncio.Event()

    async def loop_until_cancelled() -> None:
        while True:  # the shape of the outbox deliverer's loop
            waiting.set()
            await wait_event(event, 30)
            event.clear()

    task = asyncio.create_task(loop_until_cancelled())
    await waiting.wait()
    event.set()  # the wake-up and the shutdown in the same turn of the loop
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)  # with wait_for inside the loop this ran on, and timed out here
