"""The gateway's own Redis channel (PostgreSQL + Redis suite): closing the gateway asks its receive to
stop with a message on its own channel, which ends it at once and leaves the outbox group. (A
cancellation reaches channels_redis' blocking pop only when the pop returns, up to 5 s later: closes
waited out that bound, and the channel stayed in the group, sent every process's wake-ups for a day.)"""

import asyncio
import logging
import os
import time

import pytest
from channels.layers import get_channel_layer

from chat.gateway.registry import Gateway
from chat.notify import CLOSE_SECONDS, OUTBOX_GROUP, ChannelLayerNotifier

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="the gateway's channel needs REDIS_URL")


async def members() -> set[str]:
    layer = get_channel_layer()
    key = layer._group_key(OUTBOX_GROUP)
    connection = layer.connection(layer.consistent_hash(OUTBOX_GROUP))
    return {m.decode() for m in await connection.zrange(key, 0, -1)}


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
