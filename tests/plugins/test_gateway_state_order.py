"""A gateway's state reports are answered in the order its plugin made them, on the real gateway (this
test's loop) and the real host methods (plugins.gateways): the NapCat adapter plugin keeps what it last had
accepted as its state, so an answer that overtakes an earlier one leaves it believing itself ready while
the host is not (it then never reports ready again until its next disconnect: no message goes out).

The interleaving a loaded machine made (CI, test_adapter_plugins_live.py::test_a_napcat_restart_loses_nothing):
NapCat's lifecycle event and the plugin's get_login_info each report `ready: true`; the first is being
recorded (its connection record is open, the bot's account still being written) when NapCat goes away and
the plugin reports `ready: false`. Here the first report is held where it was then (the account's write),
while the repeat and `ready: false` come in."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from chat.gateway import get_gateway, plugin_adapters
from chat.models import AdapterConnection
from plugins import gateways
from plugins.records import ComponentInfo, PluginRecord, PluginState
from tests.conftest import db, wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 20.0
READY = {"gateway_name": "napcat_gateway", "ready": True, "platform": "qq", "account_id": "3000000001"}
DOWN = {"gateway_name": "napcat_gateway", "ready": False, "platform": "qq"}


class Runner:
    """The runner the reports come from (the host only tells runners apart)."""

    stopping = False


class Host:
    """What plugins.gateways.register needs of the plugin host: its undo list (no loop: nobody waits)."""

    loop = None

    def __init__(self) -> None:
        self.undo: list = []

    def on_unregister(self, undo) -> None:
        self.undo.append(undo)


@pytest.fixture
async def napcat_gateway(tmp_path):
    """A registered duplex `qq` gateway of an adapter plugin, on a started gateway; unregistered after."""
    gateway = get_gateway()
    runner, host = Runner(), Host()
    record = PluginRecord(folder=tmp_path, plugin_id="test.maibot.napcat-order", state=PluginState.LOADED)
    record.manifest = SimpleNamespace(plugin_type="adapter")
    record.process = runner
    component = ComponentInfo(
        name="napcat_gateway", type="MESSAGE_GATEWAY", handler="", metadata={"route_type": "duplex", "platform": "qq"}
    )
    assert gateways.register(host, record, component) == ""
    yield record, runner
    for undo in host.undo:
        undo()
    await gateway.aclose()


async def test_state_reports_are_answered_in_the_order_they_were_made(napcat_gateway, monkeypatch):
    record, runner = napcat_gateway
    learn, held, release = plugin_adapters.bot_account_learn, threading.Event(), threading.Event()

    def learn_held(platform: str, account: str):
        held.set()
        release.wait(TIMEOUT)
        return learn(platform, account)

    monkeypatch.setattr(plugin_adapters, "bot_account_learn", learn_held)
    answered: list[tuple[str, bool]] = []

    async def report(name: str, payload: dict, started: asyncio.Event) -> None:
        started.set()
        answer = await gateways.host_method(record, runner, gateways.UPDATE_STATE, payload)
        answered.append((name, answer["ready"]))

    async def made(name: str, payload: dict) -> asyncio.Task:
        started = asyncio.Event()
        task = asyncio.ensure_future(report(name, payload, started))
        await started.wait()  # it ran up to where it waits (on a thread, or its turn)
        return task

    try:
        first = await made("lifecycle ready", READY)
        await asyncio.to_thread(held.wait, TIMEOUT)  # recorded (its record is open), the account being written
        assert await db(lambda: AdapterConnection.objects.filter(protocol="plugin", disconnected_at=None).exists())
        again = await made("login ready", READY)
        down = await made("disconnected", DOWN)
    finally:
        release.set()
    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(first, again, down)

    assert answered == [("lifecycle ready", True), ("login ready", True), ("disconnected", False)]
    # What the plugin last had accepted is what the host holds: not ready, the record closed.
    assert gateways.gateways_of(record.plugin_id)[0].conn is None
    await wait_for_async(
        lambda: not AdapterConnection.objects.filter(protocol="plugin", disconnected_at=None).exists(),
        what="the connection record closed",
    )
    assert "qq" not in get_gateway().connections.adapters
