"""The delivery gate's rules for a platform not yet known to echo (chat.delivery_gate), in-process: the
gate's bookkeeping on its own, the row services with the injected clock, and a fresh platform through
the project's ASGI app (Channels' WebsocketCommunicator). The rules for platforms that echo are in
test_delivery.py; the issue's scenario with the NapCat stand-in against a real daphne is in
test_delivery_live.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from chat.delivery_gate import DeliveryGate, Overdue, outbox_confirm_overdue, outbox_unanswered_probes
from chat.gateway import get_gateway
from chat.ingest import AdapterFrames, adapter_connection_close, adapter_connection_open, adapter_frames_store
from chat.models import AdapterPlatform, Message
from chat.outbox_rows import outbox_claim, outbox_finish, outbox_sweep
from chat.services import Outbound, messages_send
from core.config import override
from tests.chat.gateway_helpers import TIMEOUT, adapter
from tests.chat.test_delivery import echo_frame, rounds_pass
from tests.conftest import db, wait_for_async

CONFIRM = 10.0


@pytest.fixture(autouse=True)
def delivery_config():
    with override(gateway={"confirm_seconds": CONFIRM, "max_delivery_attempts": 3}) as cfg:
        yield cfg


# --- the gate's bookkeeping -----------------------------------------------------------------------------


@dataclass
class Conn:
    """What the gate keeps on a connection (chat.gateway.connections.Connection's gate fields)."""

    platform: str = "qq"
    ready: bool = False
    opened_at: datetime | None = None
    proven: bool = False
    probe_id: int | None = None
    wary: bool = False


def gate_with(conn: Conn, **known) -> DeliveryGate:
    gate = DeliveryGate({conn.platform: conn})
    conn.opened_at = timezone.now()
    gate.connected(conn, **known)
    return gate


def missed(row_id: int, conn: Conn) -> list[Overdue]:
    return [Overdue(id=row_id, platform=conn.platform, sent_at=timezone.now(), again=True)]


def test_an_unproven_platform_takes_one_row_at_a_time_and_awaits_its_echo():
    conn = Conn()
    gate = gate_with(conn, echoes=False)
    assert (list(gate.adapter_platforms()), list(gate.probing_platforms())) == ([], ["qq"])
    assert list(gate.confirming_platforms()) == ["qq"]  # its hand-overs carry a confirm deadline
    # Nothing out yet: no deadline to look at, nothing to conclude from.
    assert (list(gate.overdue_platforms()), list(gate.concluding_platforms())) == ([], [])
    assert gate.take(conn, 1) and not gate.take(conn, 2)
    assert list(gate.probing_platforms()) == []
    assert (list(gate.overdue_platforms()), list(gate.concluding_platforms())) == (["qq"], ["qq"])

    gate.not_written(conn, 1)  # the write failed: no probe out, the next round tries again
    assert list(gate.probing_platforms()) == ["qq"] and list(gate.concluding_platforms()) == []


def test_an_echo_proves_an_unproven_platform_and_its_backlog_flows():
    conn = Conn()
    gate = gate_with(conn, echoes=False)
    gate.take(conn, 1)
    assert not gate.echo_seen(conn, {"echo": "x"})  # no platform id: proves nothing
    assert gate.echo_seen(conn, {"echo": "x", "actual_id": 7})
    assert list(gate.adapter_platforms()) == ["qq"] and list(gate.concluding_platforms()) == []
    assert gate.echoing == {"qq"} and gate.take(conn, 2) and gate.take(conn, 3)


def test_a_platform_shown_never_to_echo_takes_whatever_is_due_and_awaits_nothing():
    conn = Conn()
    gate = gate_with(conn, echoes=False)
    gate.take(conn, 1)
    gate.never_echoes(["qq"])
    assert (list(gate.adapter_platforms()), list(gate.probing_platforms())) == (["qq"], [])
    assert list(gate.confirming_platforms()) == [] and list(gate.overdue_platforms()) == []
    assert conn.probe_id is None
    # Remembered: its next connection (read from the platform's row) is not gated at all.
    again = Conn()
    gate = gate_with(again, echoes=False, never_echoes=True)
    assert list(gate.adapter_platforms()) == ["qq"] and list(gate.confirming_platforms()) == []


def test_after_an_outage_the_first_unanswered_probe_goes_again_and_the_next_one_concludes():
    conn = Conn()
    gate = gate_with(conn, echoes=False, after_outage=True)
    assert conn.wary
    gate.take(conn, 1)
    assert list(gate.concluding_platforms()) == []  # its deadline sends it again instead
    gate.confirm_missed(missed(1, conn))
    assert (conn.probe_id, conn.wary) == (None, False)
    assert list(gate.probing_platforms()) == ["qq"]
    gate.take(conn, 1)
    assert list(gate.concluding_platforms()) == ["qq"]


def test_platforms_known_to_echo_or_not_are_never_wary():
    for known in ({"echoes": True}, {"echoes": False, "never_echoes": True}):
        conn = Conn()
        gate_with(conn, after_outage=True, **known)
        assert not conn.wary


def test_a_platform_known_to_echo_is_gated_as_before():
    conn = Conn()
    gate = gate_with(conn, echoes=True)
    assert list(gate.probing_platforms()) == ["qq"] and list(gate.confirming_platforms()) == ["qq"]
    assert list(gate.overdue_platforms()) == ["qq"]  # looked at every round, as before
    gate.take(conn, 1)
    assert list(gate.concluding_platforms()) == []  # a platform that echoes is never concluded silent
    gate.confirm_missed(missed(1, conn))
    assert list(gate.probing_platforms()) == ["qq"]


# --- the row services, with the injected clock ------------------------------------------------------------


def probe(now, platform: str = "qq") -> list[int]:
    """One deliverer round for an unproven connection: the oldest due row, awaiting its echo."""
    token, batch = outbox_claim(adapter_platforms=[], web_users=[], accept_formats={}, probing=[platform], now=now)
    ids = [d.message_id for d in batch]
    outbox_finish(token=token, sent=ids, released=[], failed={}, awaiting_echo=ids, now=now)
    return ids


def flow(now, platform: str = "qq") -> list[int]:
    """One round for a connection that takes whatever is due (a platform that never echoes)."""
    token, batch = outbox_claim(adapter_platforms=[platform], web_users=[], accept_formats={}, now=now)
    ids = [d.message_id for d in batch]
    outbox_finish(token=token, sent=ids, released=[], failed={}, now=now)
    return ids


def row(message: Message) -> Message:
    return Message.objects.get(pk=message.pk)


def test_an_unanswered_probe_shows_the_platform_never_echoes_and_it_is_sent_once(make_session, clock):
    rows = messages_send([Outbound(session=make_session(), source_kind="proactive", text=f"m{i}") for i in range(3)])
    assert adapter_connection_open(platform="qq", protocol="ws", remote="127.0.0.1:1").after_outage is False
    assert probe(clock.now) == [rows[0].pk]
    clock.advance(CONFIRM - 0.5)
    assert outbox_unanswered_probes(platforms=["qq"], now=clock.now) == []
    clock.advance(0.5)
    assert outbox_unanswered_probes(platforms=["qq"], now=clock.now) == ["qq"]
    first = row(rows[0])
    assert (first.delivery_status, first.delivery_attempts, first.next_attempt_at) == ("sent", 1, None)
    assert AdapterPlatform.objects.get(platform="qq").no_echo_at == clock.now
    # Settled at most once: nothing of it is overdue any more, the rest flows, and is never handed over again.
    clock.advance(600)
    assert outbox_confirm_overdue(platforms=None, now=clock.now) == []
    assert flow(clock.now) == [rows[1].pk, rows[2].pk]
    assert flow(clock.now) == []
    # Remembered for the platform's next connections.
    opened = adapter_connection_open(platform="qq", protocol="ws", remote="127.0.0.1:2")
    assert (opened.echoes, opened.never_echoes, opened.after_outage) == (False, True, False)


def test_a_platform_whose_echo_came_meanwhile_is_not_taken_for_silent(make_session, clock):
    (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="late echo")])
    probe(clock.now)
    AdapterPlatform.objects.create(platform="qq", first_echo_at=clock.now)  # chat.ingest stored an echo
    clock.advance(CONFIRM)
    assert outbox_unanswered_probes(platforms=["qq"], now=clock.now) == []
    assert AdapterPlatform.objects.get(platform="qq").no_echo_at is None
    assert row(message).next_attempt_at is not None  # left to the rules of a platform that echoes


def test_an_echo_after_the_verdict_makes_the_platform_one_that_echoes(make_session, clock):
    first, second = messages_send([Outbound(session=make_session(), source_kind="proactive", text=t) for t in "ab"])
    probe(clock.now)
    clock.advance(CONFIRM)
    outbox_unanswered_probes(platforms=["qq"], now=clock.now)
    flow(clock.now)
    adapter_frames_store(
        frames=AdapterFrames(receipts=[("qq", {"type": "echo", "echo": str(second.uid), "actual_id": 99})])
    )
    known = AdapterPlatform.objects.get(platform="qq")
    assert known.echoes and not known.never_echoes and known.no_echo_at is None
    assert (row(first).delivery_status, row(second).delivery_status) == ("sent", "delivered")
    assert adapter_connection_open(platform="qq", protocol="ws", remote="127.0.0.1:3").echoes


def test_an_outage_before_the_verdict_keeps_the_rest_queued_and_the_probe_sent_once(make_session, clock):
    rows = messages_send([Outbound(session=make_session(), source_kind="proactive", text=f"m{i}") for i in range(3)])
    gone = adapter_connection_open(platform="qq", protocol="ws", remote="127.0.0.1:1")
    probe(clock.now)
    adapter_connection_close(record_id=gone.record_id, close_code=1006)
    # The connection went; nobody serves the platform past the probe's deadline and a delivery lease:
    # the sweep does not hand it over again (its fate is unknown on a platform not known to echo).
    clock.advance(CONFIRM + 61)
    outbox_sweep(now=clock.now)
    assert (row(rows[0]).delivery_status, row(rows[0]).delivery_attempts) == ("sent", 1)
    # The next connection: the probe awaits nothing more; the rest is still queued, untouched.
    opened = adapter_connection_open(platform="qq", protocol="ws", remote="127.0.0.1:2")
    assert (opened.echoes, opened.never_echoes, opened.after_outage) == (False, False, True)
    assert (row(rows[0]).delivery_status, row(rows[0]).next_attempt_at) == ("sent", None)
    assert [row(m).delivery_status for m in rows[1:]] == ["pending", "pending"]
    assert outbox_unanswered_probes(platforms=["qq"], now=clock.now) == []  # nothing of the new one's yet
    assert probe(clock.now) == [rows[1].pk]


def test_a_wary_connections_unanswered_probe_is_handed_over_again_with_a_longer_window(make_session, clock):
    (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="again")])
    probe(clock.now)
    clock.advance(CONFIRM)
    (overdue,) = outbox_confirm_overdue(platforms=["qq"], now=clock.now)  # what a wary connection's round does
    assert (overdue.id, overdue.again) == (message.pk, True)
    assert probe(clock.now) == [message.pk]
    again = row(message)
    assert (again.delivery_attempts, again.next_attempt_at) == (2, clock.now + timedelta(seconds=2 * CONFIRM))


def test_an_echo_from_another_platform_neither_proves_nor_clears_a_platform(make_session, clock):
    (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="qq's")])
    probe(clock.now)
    clock.advance(CONFIRM)
    outbox_unanswered_probes(platforms=["qq"], now=clock.now)
    # An adapter of another platform (its own token) echoes qq's message: a forged receipt.
    adapter_frames_store(
        frames=AdapterFrames(receipts=[("discord", {"type": "echo", "echo": str(message.uid), "actual_id": 1})])
    )
    qq = AdapterPlatform.objects.get(platform="qq")
    assert qq.never_echoes and not qq.echoes
    assert not AdapterPlatform.objects.filter(platform="discord", first_echo_at__isnull=False).exists()
    assert row(message).delivery_status == "sent"


# --- a fresh platform through the ASGI app ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_fresh_platform_gets_one_message_until_a_window_shows_it_never_echoes_then_everything(
    app, make_session
):
    def setup():
        session = make_session()
        return messages_send([Outbound(session=session, source_kind="proactive", text=f"m{i}") for i in range(3)])

    rows = await db(setup)
    uids = [str(m.uid) for m in rows]
    with override(
        gateway={"confirm_seconds": 600.0, "max_delivery_attempts": 3, "outbox_poll_seconds_with_redis": 0.2}
    ):
        comm = adapter(app)
        assert (await comm.connect(timeout=TIMEOUT))[0]
        try:
            first = await comm.receive_json_from(timeout=TIMEOUT)
            assert first["message_info"]["message_id"] == uids[0]
            await rounds_pass()
            assert await comm.receive_nothing(timeout=0.01)
            await wait_for_async(
                lambda: Message.objects.filter(pk=rows[0].pk, delivery_status="sent").exists(), what="the probe sent"
            )
            # Its window passes (moved, not waited for) on the connection, still up, with no echo.
            await db(lambda: Message.objects.filter(pk=rows[0].pk).update(next_attempt_at=timezone.now()))
            get_gateway().deliverer.wake()
            later = [(await comm.receive_json_from(timeout=TIMEOUT))["message_info"]["message_id"] for _ in range(2)]
            assert later == uids[1:]
            known = await db(lambda: AdapterPlatform.objects.get(platform="qq"))
            assert known.never_echoes
            await wait_for_async(
                lambda: Message.objects.filter(delivery_status="sent", next_attempt_at__isnull=True).count() == 3,
                what="all three sent, awaiting nothing",
            )
        finally:
            await comm.disconnect()

        # Remembered: the next connection takes the backlog at once, each message once.
        more = await db(
            lambda: messages_send(
                [Outbound(session=Message.objects.get(pk=rows[0].pk).session, source_kind="proactive", text=t)
                 for t in ("n0", "n1")]
            )
        )  # fmt: skip
        comm = adapter(app)
        assert (await comm.connect(timeout=TIMEOUT))[0]
        try:
            got = [(await comm.receive_json_from(timeout=TIMEOUT))["message_info"]["message_id"] for _ in range(2)]
            assert got == [str(m.uid) for m in more]
            await rounds_pass()
            assert await comm.receive_nothing(timeout=0.01)
        finally:
            await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_fresh_platforms_first_echo_lets_its_backlog_flow(app, make_session):
    def setup():
        session = make_session()
        return messages_send([Outbound(session=session, source_kind="proactive", text=f"m{i}") for i in range(3)])

    rows = await db(setup)
    uids = [str(m.uid) for m in rows]
    with override(gateway={"confirm_seconds": 600.0, "outbox_poll_seconds_with_redis": 0.2}):
        comm = adapter(app)
        assert (await comm.connect(timeout=TIMEOUT))[0]
        try:
            assert (await comm.receive_json_from(timeout=TIMEOUT))["message_info"]["message_id"] == uids[0]
            await rounds_pass()
            assert await comm.receive_nothing(timeout=0.01)
            await comm.send_json_to(echo_frame(uids[0], 1001))
            later = [(await comm.receive_json_from(timeout=TIMEOUT))["message_info"]["message_id"] for _ in range(2)]
            assert later == uids[1:]
            known = await wait_for_async(
                lambda: AdapterPlatform.objects.filter(platform="qq", first_echo_at__isnull=False).first(),
                what="the platform known to echo",
            )
            assert not known.never_echoes
        finally:
            await comm.disconnect()
