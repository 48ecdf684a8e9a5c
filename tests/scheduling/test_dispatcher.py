"""Delivery of scheduled messages: claim, send through the send service, retries, leases, expiry."""

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import DeliveryStatus, Message, SourceKind
from core import config
from scheduling import dispatcher
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import SYSTEM, scheduled_message_create

pytestmark = pytest.mark.django_db


def schedule(session, *, seconds=60, text="hello"):
    return scheduled_message_create(
        session=session, send_at=timezone.now() + timedelta(seconds=seconds), message_text=text, acted_by=SYSTEM
    ).task


def make_due(task, ago=0.0):
    ScheduledMessage.objects.filter(pk=task.pk).update(
        send_at=timezone.now() - timedelta(seconds=ago), due_at=timezone.now() - timedelta(seconds=ago)
    )


def test_due_message_is_sent_as_written_through_the_send_service(make_session):
    session = make_session()
    task = schedule(session, text="起床啦 wake up")
    make_due(task)
    report = dispatcher.deliver_due()
    assert (report.claimed, report.sent) == (1, 1)
    task.refresh_from_db()
    assert task.status == ScheduledStatus.SENT
    msg = task.sent_message
    assert msg.text == "起床啦 wake up"
    assert msg.source_kind == SourceKind.SCHEDULED_SEND
    assert msg.delivery_status == DeliveryStatus.PENDING  # in the outbox, for the gateway
    assert msg.session == session and msg.receiver_id == session.user_id
    assert msg.segments == [{"type": "text", "data": "起床啦 wake up"}]
    assert task.sent_at >= task.send_at


def test_not_yet_due_messages_wait(make_session):
    schedule(make_session(), seconds=30)
    assert dispatcher.deliver_due().claimed == 0
    assert not Message.objects.exists()


def test_a_second_round_sends_nothing_again(make_session):
    task = schedule(make_session())
    make_due(task)
    dispatcher.deliver_due()
    assert dispatcher.deliver_due().claimed == 0
    assert Message.objects.count() == 1


def test_claim_is_exclusive(make_session):
    tasks = [schedule(make_session()) for _ in range(5)]
    for t in tasks:
        make_due(t)
    now = timezone.now()
    _, first = dispatcher.claim_due(now, limit=100, lease_seconds=30)
    _, second = dispatcher.claim_due(now, limit=100, lease_seconds=30)
    assert len(first) == 5 and second == []


def test_a_stale_claim_cannot_finish_after_its_lease_was_taken_back(make_session):
    task = schedule(make_session())
    make_due(task)
    token, claimed = dispatcher.claim_due(timezone.now(), limit=10, lease_seconds=0.001)
    # The claimer "crashes"; later the lease is recovered and another dispatcher sends it.
    later = timezone.now() + timedelta(seconds=1)
    assert dispatcher.recover_expired_leases(later) == 1
    report = dispatcher.deliver_due(later)
    assert report.sent == 1
    # The crashed claimer wakes up and tries to finish: nothing is written twice.
    assert dispatcher._finish_batch(token, claimed) == []
    assert Message.objects.count() == 1


def test_overdue_messages_after_downtime_are_sent_at_once_with_lateness_recorded(make_session):
    task = schedule(make_session())
    make_due(task, ago=600)
    dispatcher.deliver_due()
    task.refresh_from_db()
    assert task.status == ScheduledStatus.SENT
    assert task.lateness_seconds >= 600


def test_messages_older_than_the_expiry_fail_as_expired(make_session):
    task = schedule(make_session())
    with config.override(scheduling={"expire_after_seconds": 300}):
        make_due(task, ago=301)
        report = dispatcher.deliver_due()
    assert report.expired == 1
    task.refresh_from_db()
    assert (task.status, task.last_error) == (ScheduledStatus.FAILED, "expired")
    assert not Message.objects.exists()


def test_failed_sends_are_retried_with_backoff_then_fail(make_session, monkeypatch):
    task = schedule(make_session())
    make_due(task)
    calls = []

    def broken(items, now=None):  # fault injection: the send service raises
        calls.append(len(items))
        raise RuntimeError("adapter exploded")

    monkeypatch.setattr(dispatcher, "messages_send", broken)
    with config.override(scheduling={"max_attempts": 3, "retry_backoff_seconds": 10}):
        report = dispatcher.deliver_due()
        assert report.retried == 1
        task.refresh_from_db()
        assert task.status == ScheduledStatus.PENDING and task.attempts == 1
        assert "adapter exploded" in task.last_error
        first_delay = (task.due_at - timezone.now()).total_seconds()
        assert 8 < first_delay <= 10
        dispatcher.deliver_due(timezone.now() + timedelta(seconds=11))
        task.refresh_from_db()
        second_delay = (task.due_at - timezone.now()).total_seconds()
        assert 18 < second_delay <= 20  # doubled
        dispatcher.deliver_due(timezone.now() + timedelta(seconds=21))
    task.refresh_from_db()
    assert task.status == ScheduledStatus.FAILED and task.attempts == 3
    assert "adapter exploded" in task.last_error
    assert not Message.objects.exists()


def test_one_bad_row_does_not_hold_back_the_batch(make_session, monkeypatch):
    good, bad = schedule(make_session(), text="good"), schedule(make_session(), text="bad")
    make_due(good)
    make_due(bad)
    real = dispatcher.messages_send

    def picky(items, now=None):
        if any(i.text == "bad" for i in items):
            raise ValueError("cannot send this one")
        return real(items, now=now)

    monkeypatch.setattr(dispatcher, "messages_send", picky)
    report = dispatcher.deliver_due()
    assert (report.sent, report.retried) == (1, 1)
    assert Message.objects.get().text == "good"


# --- with an injected clock: leases, backoff, expiry and the loop, to the exact instant --------------


def due_at(task, when):
    ScheduledMessage.objects.filter(pk=task.pk).update(send_at=when, due_at=when)


def test_a_lease_is_taken_back_only_once_it_has_run_out(make_session, clock):
    task = schedule(make_session())
    due_at(task, clock.now)
    token, [claimed] = dispatcher.claim_due(clock(), limit=10, lease_seconds=30)
    assert claimed.lease_until == clock.now + timedelta(seconds=30)
    clock.advance(30)  # the lease ends now: still held
    report = dispatcher.deliver_due(clock=clock)
    assert (report.recovered, report.claimed) == (0, 0)
    clock.advance(0.001)
    report = dispatcher.deliver_due(clock=clock)
    assert (report.recovered, report.claimed, report.sent) == (1, 1, 1)
    task.refresh_from_db()
    assert task.status == ScheduledStatus.SENT and task.attempts == 2 and task.sent_at == clock.now
    assert dispatcher._finish_batch(token, [claimed], clock) == []  # the first claimer lost it


def test_retries_back_off_exactly_doubling_then_fail(make_session, clock, monkeypatch):
    task = schedule(make_session())
    due_at(task, clock.now)

    def broken(items, now=None):
        raise RuntimeError("adapter exploded")

    monkeypatch.setattr(dispatcher, "messages_send", broken)
    with config.override(scheduling={"max_attempts": 3, "retry_backoff_seconds": 10}):
        assert dispatcher.deliver_due(clock=clock).retried == 1
        task.refresh_from_db()
        assert task.due_at == clock.now + timedelta(seconds=10) and task.attempts == 1
        clock.advance(9.999)
        assert dispatcher.deliver_due(clock=clock).claimed == 0  # not yet
        clock.advance(0.001)
        assert dispatcher.deliver_due(clock=clock).retried == 1
        task.refresh_from_db()
        assert task.due_at == clock.now + timedelta(seconds=20) and task.attempts == 2
        clock.advance(20)
        assert dispatcher.deliver_due(clock=clock).failed == 1
    task.refresh_from_db()
    assert (task.status, task.attempts, task.updated_at) == (ScheduledStatus.FAILED, 3, clock.now)
    assert [e["at"] for e in task.history if e["event"] == "attempt_failed"] == [
        (clock.now - timedelta(seconds=s)).isoformat() for s in (30, 20, 0)
    ]


def test_expiry_starts_just_past_the_configured_age(make_session, clock):
    task = schedule(make_session())
    due_at(task, clock.now)
    with config.override(scheduling={"expire_after_seconds": 300}):
        clock.advance(300)
        # Exactly at the expiry age it is still sent (late): check the cut-off without sending.
        assert dispatcher.expire_overdue(clock()) == 0
        clock.advance(0.001)
        report = dispatcher.deliver_due(clock=clock)
    assert (report.expired, report.claimed) == (1, 0)
    task.refresh_from_db()
    assert (task.status, task.last_error, task.updated_at) == (ScheduledStatus.FAILED, "expired", clock.now)


def test_the_loop_sleeps_until_the_next_due_instant_and_sends_it_then(make_session, clock):
    loop = dispatcher.Dispatcher(sources=[dispatcher.ScheduledMessageSource(clock)], clock=clock)
    poll = config.get_config().scheduling.poll_interval
    assert loop.seconds_to_sleep() == poll  # nothing scheduled
    task = schedule(make_session())
    due_at(task, clock.now + timedelta(seconds=poll / 5))
    assert loop.seconds_to_sleep() == pytest.approx(poll / 5)
    assert loop.tick() is False
    assert not Message.objects.exists()
    clock.advance(poll / 5 + 1.5)  # woken late: the lateness is recorded from the clock
    loop.tick()
    task.refresh_from_db()
    assert task.status == ScheduledStatus.SENT and task.lateness_seconds == pytest.approx(1.5)
    assert loop.seconds_to_sleep() == poll


# --- the claim hot path: a fixed number of queries, whatever the batch size -----------------------


def _claim_and_finish_queries(make_session, n: int) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    tasks = [schedule(make_session(), text=f"m{i}") for i in range(n)]
    when = timezone.now() - timedelta(seconds=1)
    ScheduledMessage.objects.filter(pk__in=[t.pk for t in tasks]).update(send_at=when, due_at=when)
    with CaptureQueriesContext(connection) as ctx:
        report = dispatcher.deliver_due()
    assert report.sent == n
    return len(ctx.captured_queries)


def test_claiming_and_finishing_a_batch_costs_the_same_queries_for_1_or_many_messages(make_session):
    from django.db import connection

    from chat.models import Message as MessageModel

    # As many messages as one INSERT holds on this database (SQLite caps a statement at 999 parameters,
    # so Django splits bulk inserts there; PostgreSQL takes 50 in one).
    many = min(50, connection.ops.bulk_batch_size(MessageModel._meta.concrete_fields, [None] * 50))
    assert many >= 20
    one = _claim_and_finish_queries(make_session, 1)
    batch = _claim_and_finish_queries(make_session, many)
    # expire, recover, select due, claim, read claimed; then in one transaction: lock the held rows,
    # insert the messages, touch the sessions, mark sent (one batched UPDATE), and the savepoints.
    assert one == batch, (one, batch)
    assert batch <= 13, batch
