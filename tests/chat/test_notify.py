"""The one notifier (chat.notify): chosen once from settings, and this process's deliverer woken
directly by this process's writes."""

from __future__ import annotations

import asyncio

from chat import notify
from chat.notify import ChannelLayerNotifier, LocalNotifier, get_notifier


class Deliverer:
    def __init__(self) -> None:
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1


class GatewayStub:
    def __init__(self) -> None:
        self.deliverer = Deliverer()
        self.loop = None

    def close_replaced(self, record_id) -> None:
        raise AssertionError("not expected")


def test_the_notifier_is_chosen_once_from_settings(settings):
    settings.REDIS_URL = ""
    local = get_notifier()
    assert isinstance(local, LocalNotifier) and get_notifier() is local
    settings.REDIS_URL = "redis://notify-test.invalid"
    scale_out = get_notifier()
    assert isinstance(scale_out, ChannelLayerNotifier) and get_notifier() is scale_out


def test_a_gateway_closed_late_leaves_the_newer_gateways_deliverer_registered(monkeypatch):
    monkeypatch.setattr(notify, "wake_local", lambda: 0)
    old, new = GatewayStub(), GatewayStub()
    old_listener, new_listener = notify.GatewayListener(old), notify.GatewayListener(new)
    old_listener.open()
    new_listener.open()
    asyncio.run(old_listener.close())
    LocalNotifier().wake_outbox()
    assert (old.deliverer.woken, new.deliverer.woken) == (0, 1)
    asyncio.run(new_listener.close())
    LocalNotifier().wake_outbox()
    assert new.deliverer.woken == 1
