"""The gateway's own Redis channel (PostgreSQL + Redis suite): closing the gateway asks its receive to
stop with a message on its own channel, which ends it at once and leaves the outbox group. (A
cancellation reaches channels_redis' blocking pop only when the pop returns, up to 5 s later: closes
waited out that bound, and the channel stayed in the group, sent every process's wake-ups for a day.)
Both channels (the gateway's, a dispatcher's) join their group at once also on a machine booted moments
ago, where the monotonic clock, which counts from boot, is still small."""

import asyncio
import logging
import os
import time

import pytest
from channels.layers import get_channel_layer

from chat import notify
from chat.gateway.gateway import Gateway
from chat.notify import CLOSE_SECONDS, DISPATCH_GROUP, OUTBOX_GROUP, ChannelLayerNotifier
from core.aio import submit

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="the gateway's channel needs REDIS_URL")


async def members(group: str = OUTBOX_GROUP) -> set[str]:
    layer = get_channel_layer()
    key = layer._group_key(group)
    connection = layer.connection(layer.consistent_hash(group))
    return {m.decode() for m in await connection.zrange(key, 0, -1)}


class BootedMomentsAgo:
    """`time` as chat.notify reads it on a machine booted a second ago (a fresh CI runner or VM, a server
    started at boot): CLOCK_MONOTONIC counts from boot, so it reads about 1.0 now."""

    def __init__(self) -> None:
        self._offset = time.monotonic() - 1.0

    def monotonic(self) -> float:
        return time.monotonic() - self._offset


async def test_closing_ends_the_receive_at_once_and_leaves_the_outbox_group(caplog):
    gateway = Gateway()
    gateway.loop = asyncio.get_running_loop()
    listener = ChannelLayerNotifier().listen(gateway)
    assert listener.open() == "woken via Redis"
    receive = listener.receive
    assert await listener.ready(10)
    assert listener.channel_name in await members()
    # The receive is in its blocking pop now; a wake-up through the group reaches the gateway's deliverer.
    woken = asyncio.Event()
    gateway.deliverer.wake = lambda: gateway.loop.call_soon_threadsafe(woken.set)
    await get_channel_layer().group_send(OUTBOX_GROUP, {"type": "outbox.wake"})
    async with asyncio.timeout(10):
        await woken.wait()

    caplog.set_level(logging.WARNING, logger="chat.notify")
    started = time.monotonic()
    await listener.close()
    took = time.monotonic() - started
    assert receive.done() and not receive.cancelled()
    # A cancelled receive ends only when its blocking pop does (up to 5 s after it began).
    assert took < CLOSE_SECONDS / 2, f"close took {took:.2f} s: the receive was cancelled, not stopped"
    assert not [r for r in caplog.records if r.name == "chat.notify"], caplog.text
    assert listener.channel_name not in await members()


async def test_a_gateway_started_just_after_boot_joins_the_outbox_group_at_once(monkeypatch):
    monkeypatch.setattr(notify, "time", BootedMomentsAgo())
    gateway = Gateway()
    gateway.loop = asyncio.get_running_loop()
    listener = ChannelLayerNotifier().listen(gateway)
    listener.open()
    try:
        # Until it has joined, an adapter's connection waits for it (up to 5 s) and no other process's
        # wake-up reaches this gateway's deliverer.
        assert await listener.ready(CLOSE_SECONDS), "the gateway's channel did not join the outbox group"
        assert listener.channel_name in await members()
    finally:
        await listener.close()


def test_a_dispatcher_started_just_after_boot_is_woken_through_its_group(monkeypatch):
    monkeypatch.setattr(notify, "time", BootedMomentsAgo())
    inbox = ChannelLayerNotifier().dispatcher_inbox()
    inbox.open()
    try:
        assert inbox.channel_name in submit(members(DISPATCH_GROUP)).result(CLOSE_SECONDS)
        inbox.wait(0)  # nothing left over
        # As another process wakes it: through the group on Redis, not this process's direct call.
        submit(get_channel_layer().group_send(DISPATCH_GROUP, {"type": "dispatch.wake"})).result(CLOSE_SECONDS)
        assert inbox.wait(CLOSE_SECONDS), "the dispatcher's channel is not in its group"
    finally:
        inbox.close()
