"""Delivery of scheduled messages: claim, send through the send service, retries, leases, expiry."""

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import DeliveryStatus, Message, SourceKind
from maibot import config
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
