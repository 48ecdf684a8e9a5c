"""The embedded default's channel layer: Channels' in-memory layer with its expiry sweep amortised."""

import asyncio
import os

import pytest
from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer, get_channel_layer

from maibot.channel_layers import SweepingInMemoryChannelLayer


@pytest.mark.skipif(bool(os.environ.get("REDIS_URL")), reason="with REDIS_URL the layer is Redis")
def test_the_embedded_default_uses_the_sweeping_layer():
    assert isinstance(get_channel_layer(), SweepingInMemoryChannelLayer)


def test_receives_sweep_once_per_interval_not_once_each(monkeypatch):
    sweeps = []
    monkeypatch.setattr(InMemoryChannelLayer, "_clean_expired", lambda self: sweeps.append(1))
    layer = SweepingInMemoryChannelLayer(sweep_interval=3600)

    async def traffic():
        for i in range(200):
            await layer.send(f"specific.test!{i}", {"type": "x"})
            await layer.receive(f"specific.test!{i}")

    asyncio.run(traffic())
    assert len(sweeps) == 1


def test_expired_messages_and_memberships_are_still_dropped():
    layer = SweepingInMemoryChannelLayer(sweep_interval=0, expiry=-1)  # every message already expired

    async def run():
        await layer.group_add("g", "specific.test!a")
        await layer.send("specific.test!a", {"type": "stale"})
        assert "specific.test!a" in layer.channels
        receiving = asyncio.ensure_future(layer.receive("specific.test!b"))  # a receive sweeps first
        await asyncio.sleep(0)
        assert "specific.test!a" not in layer.channels  # the expired message went, its channel with it
        assert "specific.test!a" not in layer.groups.get("g", {})  # and the channel left its groups
        receiving.cancel()

    asyncio.run(run())


def test_the_configured_layer_is_a_working_channel_layer():
    layer = get_channel_layer()

    async def roundtrip():
        channel = await layer.new_channel()
        await layer.group_add("roundtrip", channel)
        await layer.group_send("roundtrip", {"type": "hello"})
        message = await layer.receive(channel)
        await layer.group_discard("roundtrip", channel)
        return message

    assert asyncio.run(roundtrip()) == {"type": "hello"}


def test_a_channel_keeps_order_and_capacity():
    layer = SweepingInMemoryChannelLayer(capacity=2)

    async def run():
        await layer.send("specific.test!q", {"type": "one"})
        await layer.send("specific.test!q", {"type": "two"})
        with pytest.raises(ChannelFull):
            await layer.send("specific.test!q", {"type": "three"})
        got = [await layer.receive("specific.test!q"), await layer.receive("specific.test!q")]
        assert got == [{"type": "one"}, {"type": "two"}] and "specific.test!q" not in layer.channels

    asyncio.run(run())


def test_a_cancelled_receiver_hands_its_message_to_the_next():
    layer = SweepingInMemoryChannelLayer()

    async def run():
        first = asyncio.ensure_future(layer.receive("specific.test!w"))
        second = asyncio.ensure_future(layer.receive("specific.test!w"))
        await asyncio.sleep(0)
        await layer.send("specific.test!w", {"type": "only"})  # wakes the first receiver...
        first.cancel()  # ...which is cancelled before it runs
        assert await second == {"type": "only"}
        assert first.cancelled()

    asyncio.run(run())
