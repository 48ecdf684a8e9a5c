"""The dispatcher waits for a wake-up or its next due instant, never polls: every service that makes work
due sooner wakes it, a message due in 2 s is sent on time with a safety poll of ten minutes, and a wake-up
lost on purpose still delivers at the safety poll."""

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from chat.notify import get_notifier
from core import config
from scheduling import dispatcher
from scheduling.life.timers import timer_create, timer_fire_now, timer_update
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import (
    SYSTEM,
    scheduled_message_cancel,
    scheduled_message_create,
    scheduled_message_edit_text,
    scheduled_message_reschedule,
    scheduled_message_retry,
    scheduled_message_send_now,
)
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LONG_POLL = 600.0


@pytest.fixture
def running_dispatcher():
    """A real dispatcher loop in a thread (as the cluster runs it), asleep once it has looked once."""
    loop = dispatcher.Dispatcher(sources=[dispatcher.ScheduledMessageSource()])
    thread = threading.Thread(target=loop.run_forever, daemon=True)

    def start():
        thread.start()
        assert wait_for(lambda: loop.rounds >= 1, timeout=10)
        return loop

    yield start
    loop.stop()
    thread.join(10)
    assert not thread.is_alive()


def create_in(session, seconds: float, text: str):
    return scheduled_message_create(
        session=session, send_at=timezone.now() + timedelta(seconds=seconds), message_text=text, acted_by=SYSTEM
    ).task


def test_a_message_due_in_two_seconds_is_sent_on_time_with_a_ten_minute_safety_poll(make_session, running_dispatcher):
    with config.override(scheduling={"poll_interval": LONG_POLL}):
        loop = running_dispatcher()
        task = create_in(make_session(), 2, "准时 on time")
        assert wait_for(lambda: ScheduledMessage.objects.get(pk=task.pk).status == ScheduledStatus.SENT, timeout=10)
    task.refresh_from_db()
    assert 0 <= task.lateness_seconds < 1.0, task.lateness_seconds
    assert loop.woken >= 1  # the creation woke it; it then slept until the due instant


def test_a_wake_up_lost_on_purpose_still_delivers_within_the_safety_poll(make_session, running_dispatcher, monkeypatch):
    poll = 3.0
    monkeypatch.setattr(type(get_notifier()), "wake_dispatchers", lambda self: None)  # every wake-up lost
    with config.override(scheduling={"poll_interval": poll}):
        loop = running_dispatcher()
        created = timezone.now()
        task = create_in(make_session(), 0.2, "lost wake")
        assert wait_for(
            lambda: ScheduledMessage.objects.get(pk=task.pk).status == ScheduledStatus.SENT, timeout=poll + 10
        )
    task.refresh_from_db()
    assert loop.woken == 0  # no wake-up reached it: the safety poll found the message
    assert (task.sent_at - created).total_seconds() < poll + 2.0


def test_a_source_that_fails_is_retried_after_a_short_backoff_not_the_safety_poll():
    calls = []

    class Broken:
        name = "broken"

        def next_due(self):
            raise RuntimeError("database gone")

        def run_due(self, now):
            calls.append(now)
            return False

    loop = dispatcher.Dispatcher(sources=[Broken()])
    with config.override(scheduling={"poll_interval": LONG_POLL}):
        assert loop.seconds_to_sleep() == dispatcher.FAILURE_BACKOFF_SECONDS


@pytest.fixture
def dispatcher_inbox():
    """A dispatcher's inbox as a cluster opens one: the local wake socket, or its channel with REDIS_URL."""
    inbox = get_notifier().dispatcher_inbox()
    assert inbox.open() != "polled"
    inbox.wait(0)  # nothing left over
    yield inbox
    inbox.close()


def _pending(session) -> str:
    return create_in(session, 3600, "later").pk


def _failed(session) -> str:
    task_id = _pending(session)
    ScheduledMessage.objects.filter(pk=task_id).update(status=ScheduledStatus.FAILED, last_error="boom")
    return task_id


def _timer(session) -> str:
    return timer_create(spec="5min", label="t", acted_by=SYSTEM, session=session).pk


# Each writer: (what it needs, made before the wake-ups are counted; the write itself).
WRITERS = {
    "create": (lambda s: s, lambda s: create_in(s, 3600, "new")),
    "reschedule": (
        _pending,
        lambda t: scheduled_message_reschedule(
            task_id=t, send_at=timezone.now() + timedelta(seconds=5), acted_by=SYSTEM
        ),
    ),
    "send_now": (_pending, lambda t: scheduled_message_send_now(task_id=t, acted_by=SYSTEM)),
    "retry": (_failed, lambda t: scheduled_message_retry(task_id=t, acted_by=SYSTEM)),
    "timer_create": (lambda s: s, lambda s: timer_create(spec="5min", label="t", acted_by=SYSTEM, session=s)),
    "timer_fire_now": (_timer, lambda t: timer_fire_now(timer_id=t, acted_by=SYSTEM)),
    "timer_update": (_timer, lambda t: timer_update(timer_id=t, spec="1min", acted_by=SYSTEM)),
}


def _quiet(inbox) -> None:
    """Take every wake-up sent so far (with Redis they may still be on their way)."""
    while inbox.wait(0.3):
        pass


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_service_that_makes_work_due_sooner_wakes_the_dispatchers(writer, make_session, dispatcher_inbox):
    prepare, write = WRITERS[writer]
    subject = prepare(make_session())
    _quiet(dispatcher_inbox)
    write(subject)
    assert dispatcher_inbox.wait(5), f"{writer} woke no dispatcher"


def test_a_service_that_moves_nothing_sooner_wakes_no_dispatcher(make_session, dispatcher_inbox):
    task_id = _pending(make_session())
    _quiet(dispatcher_inbox)
    scheduled_message_edit_text(task_id=task_id, message_text="新的 new text", acted_by=SYSTEM)
    scheduled_message_cancel(task_ids=[task_id], acted_by=SYSTEM)
    assert not dispatcher_inbox.wait(0.5)


def test_a_wake_up_is_sent_only_once_the_write_is_committed(make_session, dispatcher_inbox):
    from django.db import transaction

    session = make_session()
    with transaction.atomic():
        create_in(session, 60, "in a transaction")
        assert not dispatcher_inbox.wait(0.3), "woken before the row was visible to the dispatcher"
    assert dispatcher_inbox.wait(5)


def test_send_now_wakes_no_dispatcher_unless_its_caller_could_not_send_it(make_session, dispatcher_inbox):
    session = make_session()
    _quiet(dispatcher_inbox)
    sent = scheduled_message_create(session=session, send_at=None, message_text="now", acted_by=SYSTEM).task
    assert not dispatcher_inbox.wait(0.3)  # the API delivers it itself
    assert dispatcher.deliver_one(sent.pk).sent == 1
    assert not dispatcher_inbox.wait(0.3)

    taken = scheduled_message_create(session=session, send_at=None, message_text="taken", acted_by=SYSTEM).task
    dispatcher.claim_due(timezone.now(), limit=10, lease_seconds=30, claimer="another cluster")
    assert dispatcher.deliver_one(taken.pk).sent == 0
    assert dispatcher_inbox.wait(5)  # its fate is the dispatchers' now (a lease to run out, a retry)
