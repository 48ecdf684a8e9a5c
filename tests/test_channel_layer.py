"""The embedded default's channel layer: Channels' in-memory layer with its expiry sweep amortised."""

import asyncio
import os

import pytest
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
