"""Delivery confirmed by the platform, in-process: redelivery of sent rows that no echo confirmed (with
the injected clock the outbox functions take), rows left `sending` by a dead server, the echo
bookkeeping, accept_format across connections, and the gate a new connection passes (Channels'
WebsocketCommunicator against the project's ASGI app). The same with the NapCat stand-in against a
real daphne: test_delivery_live.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chat.delivery_errors import DeliveryError
from chat.delivery_gate import outbox_confirm_overdue
from chat.gateway import get_gateway
from chat.ingest import (
    AdapterFrames,
    adapter_connection_open,
    adapter_connection_set_accept_format,
    adapter_frames_store,
)
from chat.models import AdapterConnection, AdapterPlatform, DeliveryStatus, Message
from chat.outbox_rows import outbox_claim, outbox_finish, outbox_next_due, outbox_sweep
from chat.services import Outbound, messages_send
from core.config import override
from tests.chat.gateway_helpers import TIMEOUT, adapter
from tests.conftest import db, wait_for_async

CONFIRM = 10.0


@pytest.fixture
def echoing_qq(db) -> AdapterPlatform:
    return AdapterPlatform.objects.create(platform="qq", first_echo_at=timezone.now(), last_echo_at=timezone.now())


@pytest.fixture(autouse=True)
def delivery_config():
    with override(gateway={"confirm_seconds": CONFIRM, "max_delivery_attempts": 3}) as cfg:
        yield cfg


def hand_over(now, *, probing=(), echoing=True) -> list[int]:
    """One deliverer round as the gateway runs it: claim what is due, hand it over, record it."""
    token, batch = outbox_claim(
        adapter_platforms=[] if probing else ["qq"], web_users=[], accept_formats={}, probing=probing, now=now
    )
    ids = [d.message_id for d in batch]
    outbox_finish(token=token, sent=ids, released=[], failed={}, awaiting_echo=ids if echoing else (), now=now)
    return ids


def row(message: Message) -> Message:
    return Message.objects.get(pk=message.pk)


def test_a_sent_row_without_echo_is_handed_over_again_with_doubling_waits_then_unconfirmed(
    echoing_qq, make_session, clock
):
    (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="are you there")])
    handed_at = []
    for attempt in (1, 2, 3):
        assert hand_over(clock.now) == [message.pk]
        handed_at.append(clock.now)
        sent = row(message)
        assert (sent.delivery_status, sent.delivery_attempts, sent.sent_at) == ("sent", attempt, clock.now)
        wait = CONFIRM * 2 ** (attempt - 1)
        assert sent.next_attempt_at == clock.now + timedelta(seconds=wait)
        clock.advance(wait - 0.5)
        assert outbox_confirm_overdue(platforms=["qq"], now=clock.now) == []
        assert hand_over(clock.now) == []
        clock.advance(0.5)
        (overdue,) = outbox_confirm_overdue(platforms=["qq"], now=clock.now)
        assert (overdue.id, overdue.platform, overdue.again) == (message.pk, "qq", attempt < 3)
    final = row(message)
    assert (final.delivery_status, final.delivery_error, final.delivery_attempts) == ("unconfirmed", "no_echo", 3)
    assert final.sent_at == handed_at[-1] and final.next_attempt_at is None
    # Settled: never handed over again.
    clock.advance(3600)
    assert outbox_confirm_overdue(platforms=None, now=clock.now) == []
    assert hand_over(clock.now) == []


def test_a_row_claimed_but_not_handed_over_keeps_its_attempt_budget(echoing_qq, make_session, clock):
    (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="not yet")])
    for _ in range(5):  # e.g. the connection went away mid-batch: released, never written
        token, batch = outbox_claim(
            adapter_platforms=["qq"], web_users=[], accept_formats={}, probing=(), now=clock.now
        )
        assert [d.attempts for d in batch] == [1]
        outbox_finish(token=token, sent=[], released=[message.pk], failed={}, now=clock.now)
    released = row(message)
    assert (released.delivery_status, released.delivery_attempts) == ("pending", 0)
    assert hand_over(clock.now) == [message.pk]
    assert row(message).delivery_attempts == 1


def test_an_echo_settles_a_row_even_after_its_deadline(echoing_qq, make_session, clock):
    (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="late echo")])
    hand_over(clock.now)
    clock.advance(CONFIRM)
    outbox_confirm_overdue(platforms=["qq"], now=clock.now)
    assert row(message).delivery_status == "pending"
    adapter_frames_store(
        frames=AdapterFrames(receipts=[("qq", {"type": "echo", "echo": str(message.uid), "actual_id": 42})])
    )
    delivered = row(message)
    assert (delivered.delivery_status, delivered.platform_message_id, delivered.next_attempt_at) == (
        "delivered",
        "42",
        None,
    )
    assert hand_over(clock.now) == []


def test_redelivery_goes_oldest_first_and_skips_rows_not_due_yet(echoing_qq, make_session, clock):
    session = make_session()
    first, second, later = messages_send(
        [Outbound(session=session, source_kind="proactive", text=t) for t in ("first", "second", "later")]
    )
    Message.objects.filter(pk=later.pk).update(next_attempt_at=clock.now + timedelta(seconds=5))
    assert hand_over(clock.now) == [first.pk, second.pk]
    clock.advance(CONFIRM)
    outbox_confirm_overdue(platforms=["qq"], now=clock.now)
    assert hand_over(clock.now) == [first.pk, second.pk, later.pk]


def test_a_connection_on_probation_is_handed_the_oldest_due_row_only(echoing_qq, make_session, clock):
    rows = messages_send([Outbound(session=make_session(), source_kind="proactive", text=f"m{i}") for i in range(3)])
    assert hand_over(clock.now, probing=["qq"]) == [rows[0].pk]
    # While it awaits its echo, nothing else is due for a probe... until its deadline passes.
    clock.advance(CONFIRM)
    outbox_confirm_overdue(platforms=["qq"], now=clock.now)
    assert hand_over(clock.now, probing=["qq"]) == [rows[0].pk]
    assert Message.objects.filter(delivery_status="pending").count() == 2


def test_platforms_that_never_echoed_keep_at_most_once(make_session, clock):
    session = make_session()
    sent, crashed = messages_send([Outbound(session=session, source_kind="proactive", text=t) for t in "ab"])
    assert hand_over(clock.now, echoing=False) == [sent.pk, crashed.pk]
    Message.objects.filter(pk=crashed.pk).update(
        delivery_status="sending", delivery_claim="dead", delivery_lease_until=clock.now
    )
    clock.advance(3600)
    assert outbox_confirm_overdue(platforms=None, now=clock.now) == []
    assert row(sent).delivery_status == "sent" and row(sent).next_attempt_at is None
    outbox_sweep(now=clock.now)
    assert (row(crashed).delivery_status, row(crashed).delivery_error) == ("failed", "delivery_interrupted")


def test_a_row_left_sending_by_a_dead_server_is_redelivered_on_a_platform_that_echoes(echoing_qq, make_session, clock):
    session = make_session()
    retry, spent = messages_send([Outbound(session=session, source_kind="proactive", text=t) for t in "ab"])
    lease = clock.now + timedelta(seconds=60)
    Message.objects.filter(pk=retry.pk).update(
        delivery_status="sending", delivery_claim="dead", delivery_lease_until=lease, delivery_attempts=1
    )
    Message.objects.filter(pk=spent.pk).update(
        delivery_status="sending", delivery_claim="dead", delivery_lease_until=lease, delivery_attempts=3
    )
    outbox_sweep(now=clock.now)
    assert row(retry).delivery_status == row(spent).delivery_status == "sending"  # the lease still runs
    clock.advance(61)
    outbox_sweep(now=clock.now)
    assert (row(retry).delivery_status, row(retry).delivery_claim) == ("pending", "")
    final = row(spent)
    assert (final.delivery_status, final.delivery_error, final.sent_at) == ("unconfirmed", "no_echo", clock.now)
    assert hand_over(clock.now) == [retry.pk]
    assert row(retry).delivery_attempts == 2


def test_rows_awaiting_an_echo_go_out_first_on_the_next_connection(echoing_qq, make_session, clock):
    session = make_session()
    old, waiting = messages_send([Outbound(session=session, source_kind="proactive", text=t) for t in "ab"])
    Message.objects.filter(pk=old.pk).update(
        delivery_status="sent", sent_at=timezone.now(), next_attempt_at=timezone.now() + timedelta(hours=1)
    )
    opened = adapter_connection_open(platform="qq", protocol="ws", remote="127.0.0.1:1")
    assert opened.echoes
    overdue = outbox_confirm_overdue(platforms=["qq"], now=timezone.now())
    assert [o.id for o in overdue if o.again] == [old.pk]
    _, batch = outbox_claim(adapter_platforms=[], probing=["qq"], web_users=[], accept_formats={})
    assert [d.message_id for d in batch] == [old.pk]
    assert row(waiting).delivery_status == "pending"


def test_a_sent_row_of_a_platform_nobody_serves_is_settled_by_the_sweep_one_lease_late(echoing_qq, make_session, clock):
    (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="orphan")])
    hand_over(clock.now)
    clock.advance(CONFIRM + 59)
    outbox_sweep(now=clock.now)
    assert row(message).delivery_status == "sent"
    clock.advance(1)
    outbox_sweep(now=clock.now)
    assert row(message).delivery_status == "pending"


def test_a_row_given_back_after_its_expiry_passed_is_due_for_a_sweep_at_once(make_session):
    """A sweep fails every pending row past the offline expiry that it sees. A row that was claimed while
    its expiry passed, and given back after that sweep, is due for a sweep then: the deliverer sleeps
    until outbox_next_due says, and must not sleep on to its safety sweep (outbox_sweep_seconds)."""
    with override(gateway={"offline_expiry_seconds": 10}):
        (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="late")])
        created = row(message).created_at
        token, batch = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={}, now=created)
        assert [d.message_id for d in batch] == [message.pk]
        swept_at = created + timedelta(seconds=15)  # past its expiry, but it is out: not this sweep's
        outbox_sweep(now=swept_at)
        assert row(message).delivery_status == "sending"
        given_back = swept_at + timedelta(seconds=1)
        outbox_finish(token=token, sent=[], released=[message.pk], failed={}, now=given_back)
        due = outbox_next_due(swept_at=swept_at, now=given_back)
        assert due.sweep is not None and due.sweep <= given_back, due
        outbox_sweep(now=given_back)
        assert (row(message).delivery_status, row(message).delivery_error) == ("failed", "adapter_offline")
        assert outbox_next_due(swept_at=given_back, now=given_back).sweep is None  # settled: nothing more


def test_echoes_mark_their_platform_with_one_statement_per_round_whatever_their_number(make_session):
    session = make_session()
    messages = messages_send([Outbound(session=session, source_kind="proactive", text=f"m{i}") for i in range(41)])
    assert len(hand_over(timezone.now(), echoing=False)) == 41  # only a message handed over is echoed

    def receipts(chunk):
        return [("qq", {"type": "echo", "echo": str(m.uid), "actual_id": m.pk}) for m in chunk]

    with CaptureQueriesContext(connection) as first:
        adapter_frames_store(frames=AdapterFrames(receipts=receipts(messages[:1])))
    platform = AdapterPlatform.objects.get(platform="qq")
    assert platform.echoes and platform.first_echo_at == platform.last_echo_at
    with CaptureQueriesContext(connection) as one:
        adapter_frames_store(frames=AdapterFrames(receipts=receipts(messages[1:2])))
    with CaptureQueriesContext(connection) as many:
        adapter_frames_store(frames=AdapterFrames(receipts=receipts(messages[2:])))
    # Each echo is its row's UPDATE; the platform's bookkeeping is one statement per round.
    assert len(many) - len(one) == 38
    assert len(first) > len(one)  # the first echo ever creates the platform's record
    later = AdapterPlatform.objects.get(platform="qq")
    assert later.first_echo_at == platform.first_echo_at and later.last_echo_at > platform.last_echo_at
    assert Message.objects.filter(delivery_status=DeliveryStatus.DELIVERED).count() == 41


def test_accept_format_is_kept_for_the_platform_across_connections(db):
    first = adapter_connection_open(platform="qq", protocol="ws", remote="127.0.0.1:1")
    assert first.accept_format == [] and not first.echoes
    adapter_connection_set_accept_format(record_id=first.record_id, platform="qq", accept_format=["text", "image"])
    # Even when the old connection records are gone (the dashboard prunes nothing, an operator may).
    AdapterConnection.objects.all().delete()
    second = adapter_connection_open(platform="qq", protocol="socketio", remote="127.0.0.1:2")
    assert second.accept_format == ["text", "image"]
    assert AdapterConnection.objects.get(pk=second.record_id).accept_format == ["text", "image"]


def test_the_no_echo_code_is_a_delivery_error():
    assert DeliveryError("no_echo") is DeliveryError.NO_ECHO


# --- the gate, in-process: the project's ASGI app and a 0.6.x adapter socket --------------------------


def echo_frame(uid: str, actual_id: int) -> dict:
    """A `message_id_echo` exactly as the NapCat adapter sends it through maim_message."""
    return {
        "platform": "qq",
        "message_type_name": "message_id_echo",
        "content": {"type": "echo", "echo": uid, "actual_id": actual_id},
        "timestamp": 12.5,
        "is_custom_message": True,
    }


async def rounds_pass(n: int = 3) -> None:
    """Wake the deliverer until it has run `n` more claim rounds (so what it would hand over, it has).
    Woken: it never polls, so without a wake-up or a due instant it runs none."""
    deliverer = get_gateway().deliverer
    for _ in range(n):
        start = deliverer.rounds
        deliverer.wake()

        async def ran(start: int = start) -> bool:
            return deliverer.rounds > start

        await wait_for_async(ran, what="a deliverer round")


@pytest.mark.django_db(transaction=True)
async def test_a_new_connection_gets_one_message_until_it_echoes_and_again_after_a_missed_deadline(
    app, make_session, delivery_config
):
    def setup():
        AdapterPlatform.objects.create(platform="qq", first_echo_at=timezone.now())
        session = make_session()
        return messages_send([Outbound(session=session, source_kind="proactive", text=f"m{i}") for i in range(3)])

    rows = await db(setup)
    uids = [str(m.uid) for m in rows]
    # A confirm window far longer than the test: the deadline that passes below is moved, not waited for,
    # so no round of a loaded machine (or the 5 s Redis poll) can outlast a window by accident.
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
            statuses = await db(lambda: list(Message.objects.order_by("id").values_list("delivery_status", flat=True)))
            assert statuses == ["sent", "pending", "pending"]

            # The platform side delivered the first one: the backlog flows.
            await comm.send_json_to(echo_frame(uids[0], 1001))
            later = [(await comm.receive_json_from(timeout=TIMEOUT))["message_info"]["message_id"] for _ in range(2)]
            assert later == uids[1:]
            delivered = await wait_for_async(
                lambda: Message.objects.filter(pk=rows[0].pk, delivery_status="delivered").first(), what="delivered"
            )
            assert delivered.platform_message_id == "1001"
            # Their hand-over recorded (the frames can arrive before the round's finish commits).
            await wait_for_async(
                lambda: Message.objects.filter(pk__in=[rows[1].pk, rows[2].pk], delivery_status="sent").count() == 2,
                what="the two hand-overs recorded",
            )

            # No echo for those two by their deadline (moved to now): the connection is on probation
            # again; the oldest goes again, alone.
            await db(
                lambda: Message.objects.filter(pk__in=[rows[1].pk, rows[2].pk], delivery_status="sent").update(
                    next_attempt_at=timezone.now()
                )
            )
            get_gateway().deliverer.wake()
            again = await comm.receive_json_from(timeout=TIMEOUT)
            assert again["message_info"]["message_id"] == uids[1]
            second = await wait_for_async(
                lambda: Message.objects.filter(pk=rows[1].pk).exclude(delivery_status="sending").first(),
                what="the second hand-over recorded",
            )
            assert (second.delivery_status, second.delivery_attempts) == ("sent", 2)
            await wait_for_async(
                lambda: Message.objects.filter(pk=rows[2].pk, delivery_status="pending").exists(),
                what="the third row back in the queue",
            )
            await rounds_pass()
            assert await comm.receive_nothing(timeout=0.01)
            assert await db(lambda: Message.objects.get(pk=rows[2].pk).delivery_status) == "pending"
        finally:
            await comm.disconnect()


# --- the keepalive ------------------------------------------------------------------------------------


@pytest.mark.parametrize("keepalive", [6, 6.5, 9, 15, 60, 300])
def test_daphne_drops_a_silent_peer_within_the_keepalive(keepalive):
    from maibot.management.commands.serve import DAPHNE_CHECK_SECONDS, DAPHNE_TIMER_SLACK, keepalive_options

    options = keepalive_options(keepalive)
    interval = int(options[options.index("--ping-interval") + 1])
    timeout = int(options[options.index("--ping-timeout") + 1])
    # The ping goes out at the first 2-second check after `interval` idle seconds; its timeout fires
    # in autobahn's 0.2 s timer buckets.
    assert interval + DAPHNE_CHECK_SECONDS + timeout + DAPHNE_TIMER_SLACK <= keepalive
    # A ping's timeout ends before the next ping can replace it (autobahn keeps only the latest).
    assert 1 <= timeout < interval


@pytest.mark.parametrize("keepalive", [6, 15, 300])
def test_the_socketio_server_drops_a_silent_client_within_the_keepalive(keepalive):
    from chat.gateway import mm07

    # The server takes them when it is built (at import).
    assert (mm07.sio.eio.ping_interval, mm07.sio.eio.ping_timeout) == (mm07.PING_INTERVAL, mm07.PING_TIMEOUT)
    with override(gateway={"keepalive_seconds": keepalive}):
        interval, timeout = mm07._pings()
    # A ping `interval` after the last pong, its pong awaited `timeout`, and the service task looks at
    # each socket once per `timeout`.
    assert interval + 2 * timeout <= keepalive and timeout > 0
