"""Timers: the services, exactly-once firing by the dispatcher source, missed periods, real clusters."""

from datetime import timedelta
from functools import partial

import pytest
from django.db import transaction
from django.utils import timezone

from chat.models import Message, PlannerCycle, SourceKind
from core import config
from scheduling.life import timers as timer_services
from scheduling.life.error_codes import LifeError, TimerErrorCode
from scheduling.life.models import FiringStatus, Timer, TimerFiring, TimerStatus
from scheduling.life.timers import (
    TimerSource,
    fire_due,
    requeue_stale_firings,
    timer_cancel,
    timer_create,
    timer_fire_now,
    timer_upcoming,
    timer_update,
)
from scheduling.services import SYSTEM
from tests.conftest import wait_for as shared_wait_for

pytestmark = pytest.mark.django_db


def make_due(timer, ago=0.0):
    when = timezone.now() - timedelta(seconds=ago)
    Timer.objects.filter(pk=timer.pk).update(next_fire=when)
    timer.refresh_from_db()
    return timer.next_fire


class Collector:
    def __init__(self):
        self.ids = []

    def __call__(self, ids):
        self.ids.extend(ids)


# --- services -------------------------------------------------------------------------------------


def test_a_delay_timer_is_due_that_long_from_now(make_session):
    before = timezone.now()
    timer = timer_create(spec="5分钟", label="喝水 drink water", session=make_session(), acted_by=SYSTEM)
    assert timer.status == TimerStatus.ACTIVE and timer.kind == "after"
    assert timedelta(minutes=5) <= timer.next_fire - before < timedelta(minutes=5, seconds=5)
    assert timer.pk.startswith("tm_")


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"spec": "soon"}, TimerErrorCode.INVALID_SPEC),
        ({"spec": "once:2020-01-01 09:00"}, TimerErrorCode.INVALID_SPEC),
        ({"spec": "once:2999-01-01 09:00"}, TimerErrorCode.INVALID_SPEC),
        ({"label": "  "}, TimerErrorCode.EMPTY_LABEL),
        ({"label": "x" * 201}, TimerErrorCode.LABEL_TOO_LONG),
        ({"payload": "x" * 2001}, TimerErrorCode.PAYLOAD_TOO_LONG),
    ],
)
def test_bad_timers_are_refused_with_a_code_and_nothing_is_stored(make_session, kwargs, code):
    args = {"spec": "5min", "label": "ok", "payload": "", **kwargs}
    with pytest.raises(LifeError) as exc:
        timer_create(session=make_session(), acted_by=SYSTEM, **args)
    assert exc.value.code == code
    assert exc.value.message
    assert not Timer.objects.exists()


def test_a_chat_may_hold_only_so_many_active_timers(make_session):
    session = make_session()
    with config.override(life={"max_timers_per_session": 2}):
        first = timer_create(spec="5min", label="a", session=session, acted_by=SYSTEM)
        timer_create(spec="5min", label="b", session=session, acted_by=SYSTEM)
        with pytest.raises(LifeError) as exc:
            timer_create(spec="5min", label="c", session=session, acted_by=SYSTEM)
        assert exc.value.code == TimerErrorCode.TOO_MANY_TIMERS
        timer_cancel(timer_id=first.pk, acted_by=SYSTEM)
        timer_create(spec="5min", label="c", session=session, acted_by=SYSTEM)
        timer_create(spec="5min", label="other chat", session=make_session(), acted_by=SYSTEM)


def test_cancel_keeps_the_timer_as_history_and_it_never_fires(make_session):
    session = make_session()
    timer = timer_create(spec="5min", label="a", session=session, acted_by=SYSTEM)
    timer_cancel(timer_id=timer.pk, session=session, acted_by=SYSTEM)
    timer.refresh_from_db()
    assert timer.status == TimerStatus.CANCELLED and timer.cancelled_at and timer.next_fire is None
    assert fire_due(timezone.now() + timedelta(hours=1), limit=10) == (0, [])
    with pytest.raises(LifeError) as exc:
        timer_cancel(timer_id=timer.pk, acted_by=SYSTEM)
    assert exc.value.code == TimerErrorCode.NOT_ACTIVE


def test_a_chat_cannot_cancel_another_chats_timer(make_session):
    timer = timer_create(spec="5min", label="a", session=make_session(), acted_by=SYSTEM)
    with pytest.raises(LifeError) as exc:
        timer_cancel(timer_id=timer.pk, session=make_session(), acted_by=SYSTEM)
    assert exc.value.code == TimerErrorCode.NOT_FOUND
    assert Timer.objects.get(pk=timer.pk).status == TimerStatus.ACTIVE


def test_changing_the_spec_validates_it_and_recomputes_the_next_fire(make_session):
    timer = timer_create(spec="5min", label="a", session=make_session(), acted_by=SYSTEM)
    with pytest.raises(LifeError) as exc:
        timer_update(timer_id=timer.pk, spec="cron:99 * * * *", acted_by=SYSTEM)
    assert exc.value.code == TimerErrorCode.INVALID_SPEC
    assert Timer.objects.get(pk=timer.pk).spec == "5min"
    updated = timer_update(timer_id=timer.pk, spec="cron:0 8 * * *", acted_by=SYSTEM)
    assert updated.kind == "cron" and updated.spec == "cron:0 8 * * *"
    assert updated.next_fire.astimezone(config.get_config().tzinfo).hour == 8
    assert [f.astimezone(config.get_config().tzinfo).hour for f in timer_upcoming(updated)] == [8] * 5


# --- firing ---------------------------------------------------------------------------------------


def test_a_due_one_shot_timer_fires_once_and_ends_done(make_session):
    timer = timer_create(spec="5min", label="a", session=make_session(), acted_by=SYSTEM)
    due = make_due(timer)
    collect = Collector()
    source = TimerSource(enqueue=collect)
    source.run_due(timezone.now())
    source.run_due(timezone.now())
    firing = TimerFiring.objects.get()
    assert collect.ids == [firing.pk]
    assert firing.timer_id == timer.pk and firing.due_at == due and firing.status == FiringStatus.PENDING
    assert 0 <= firing.lateness_seconds < 5
    timer.refresh_from_db()
    assert (timer.status, timer.next_fire, timer.fire_count) == (TimerStatus.DONE, None, 1)
    assert timer.last_fired_at <= firing.fired_at


def test_a_claim_for_an_instant_already_claimed_gets_nothing(make_session):
    timers = [
        timer_create(spec="cron:* * * * *", label=f"t{i}", session=make_session(), acted_by=SYSTEM) for i in range(5)
    ]
    for t in timers:
        make_due(t)
    now = timezone.now()
    seen, first = fire_due(now, limit=100)
    seen2, second = fire_due(now, limit=100)
    assert (seen, len(first)) == (5, 5)
    assert (seen2, second) == (0, [])
    assert TimerFiring.objects.count() == 5


def test_a_racing_claimer_that_read_the_same_instant_advances_nothing(make_session, monkeypatch):
    timer = timer_create(spec="cron:* * * * *", label="t", session=make_session(), acted_by=SYSTEM)
    due = make_due(timer)
    real_claim = timer_services._claim_instant

    def other_cluster_claims_first(**kwargs):
        # Another cluster claims the instant between our read and our UPDATE.
        Timer.objects.filter(pk=timer.pk).update(next_fire=due + timedelta(minutes=1))
        return real_claim(**kwargs)

    monkeypatch.setattr(timer_services, "_claim_instant", other_cluster_claims_first)
    seen, firings = fire_due(timezone.now(), limit=10)
    assert seen == 1 and firings == []
    assert not TimerFiring.objects.exists()
    assert Timer.objects.get(pk=timer.pk).fire_count == 0


def test_a_cron_timer_moves_to_its_next_time(make_session):
    timer = timer_create(spec="cron:*/5 * * * *", label="t", session=make_session(), acted_by=SYSTEM)
    first = timer.next_fire
    assert first.minute % 5 == 0 and first.second == 0
    Timer.objects.filter(pk=timer.pk).update(next_fire=first - timedelta(minutes=5))
    fire_due(first - timedelta(minutes=5) + timedelta(seconds=0.3), limit=10)
    timer.refresh_from_db()
    assert timer.next_fire == first and timer.status == TimerStatus.ACTIVE and timer.fire_count == 1


def test_after_downtime_a_cron_timer_fires_once_for_the_missed_period(make_session):
    timer = timer_create(spec="cron:*/5 * * * *", label="t", session=make_session(), acted_by=SYSTEM)
    make_due(timer, ago=3600)  # twelve ticks missed
    now = timezone.now()
    fire_due(now, limit=10)
    fire_due(now, limit=10)
    assert TimerFiring.objects.count() == 1
    timer.refresh_from_db()
    assert now < timer.next_fire <= now + timedelta(minutes=5)
    assert timer.fire_count == 1


def test_an_every_timer_repeats_from_its_schedule_not_from_when_it_fired(make_session):
    timer = timer_create(spec="every:10min", label="t", session=make_session(), acted_by=SYSTEM)
    due = make_due(timer, ago=2)
    fire_due(timezone.now(), limit=10)
    timer.refresh_from_db()
    assert timer.next_fire == due + timedelta(minutes=10)


def test_fire_now_makes_the_timer_due_at_once(make_session):
    timer = timer_create(spec="cron:0 8 * * *", label="t", session=make_session(), acted_by=SYSTEM)
    timer_fire_now(timer_id=timer.pk, acted_by=SYSTEM)
    _seen, firings = fire_due(timezone.now(), limit=10)
    assert len(firings) == 1
    timer.refresh_from_db()
    assert timer.status == TimerStatus.ACTIVE and timer.next_fire > timezone.now()


def test_a_full_batch_says_there_may_be_more_and_the_burst_is_handed_over_once_claimed(make_session):
    for i in range(3):
        make_due(timer_create(spec="5min", label=f"t{i}", session=make_session(), acted_by=SYSTEM))
    collect = Collector()
    source = TimerSource(enqueue=collect)
    with config.override(scheduling={"batch_size": 2}):
        assert source.run_due(timezone.now()) is True
        assert collect.ids == []  # a burst is claimed whole before it is handed over
        assert source.run_due(timezone.now()) is False
    assert sorted(collect.ids) == sorted(TimerFiring.objects.values_list("pk", flat=True))
    assert len(collect.ids) == 3


def test_next_due_is_the_soonest_active_timer(make_session):
    assert TimerSource().next_due() is None
    a = timer_create(spec="5min", label="a", session=make_session(), acted_by=SYSTEM)
    timer_create(spec="1h", label="b", session=make_session(), acted_by=SYSTEM)
    assert TimerSource().next_due() == a.next_fire


def test_firings_no_worker_started_are_handed_over_again(make_session):
    timer = timer_create(spec="5min", label="a", session=make_session(), acted_by=SYSTEM)
    make_due(timer)
    _, (firing_id,) = fire_due(timezone.now(), limit=10)
    sent = []
    timer_services_enqueue = timer_services.enqueue_firings
    try:
        timer_services.enqueue_firings = sent.extend
        assert requeue_stale_firings(timezone.now()) == 0
        assert requeue_stale_firings(timezone.now() + timedelta(seconds=301)) == 1
    finally:
        timer_services.enqueue_firings = timer_services_enqueue
    assert sent == [firing_id]


def test_next_due_includes_when_a_firing_in_progress_goes_stale_so_the_dispatcher_need_not_poll(make_session):
    timer = timer_create(spec="1h", label="a", session=make_session(), acted_by=SYSTEM)
    make_due(timer)
    _, (firing_id,) = fire_due(timezone.now(), limit=10)
    timer.refresh_from_db()
    enqueued = timezone.now()
    TimerFiring.objects.filter(pk=firing_id).update(enqueued_at=enqueued)
    requeue = timedelta(seconds=config.get_config().life.firing_requeue_seconds)
    source = TimerSource()
    assert source.next_due() == enqueued + requeue + timer_services.JUST_PAST  # sooner than the next fire
    # Once a maintenance round has run, not again before its pace allows (no spinning on it).
    source._last_maintenance = enqueued + requeue
    assert source.next_due() == enqueued + requeue + timedelta(seconds=source.maintenance_every)
    TimerFiring.objects.filter(pk=firing_id).update(status="done")
    assert TimerSource().next_due() == timer.next_fire


# --- real clusters --------------------------------------------------------------------------------


wait_for = partial(shared_wait_for, interval=0.1)


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_two_clusters_fire_a_timer_due_in_two_seconds_exactly_once(make_session, start_qcluster):
    start_qcluster("a")
    start_qcluster("b")
    session = make_session()
    # No model configured in the clusters (offline): a say: payload is sent as written.
    timer = timer_create(
        spec="2s", label="提醒 reminder", payload="say:该喝水了 drink water", session=session, acted_by=SYSTEM
    )
    assert wait_for(lambda: TimerFiring.objects.filter(timer=timer, status=FiringStatus.DONE).exists())
    # The one-shot timer is done (its claim ended it) and its one firing has run: no cluster can claim
    # it again, and a firing runs its turn only once, so no duplicate can still come.
    timer.refresh_from_db()
    assert (timer.status, timer.fire_count) == (TimerStatus.DONE, 1)
    firing = TimerFiring.objects.get(timer=timer)
    assert firing.outcome == "literal"
    sent = Message.objects.filter(session=session, source_kind=SourceKind.TIMER)
    assert [m.text for m in sent] == ["该喝水了 drink water"]
    assert firing.lateness_seconds < 5.0, firing.lateness_seconds  # generous: the bar is in bench/timers.py
    timer.refresh_from_db()
    assert (timer.status, timer.fire_count) == (TimerStatus.DONE, 1)
    assert PlannerCycle.objects.filter(kind="life", session=session).count() == 1


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
@pytest.mark.long
def test_two_clusters_fire_each_due_cron_instant_once_and_keep_it_active(make_session, start_qcluster):
    start_qcluster("a")
    start_qcluster("b")
    sessions = [make_session() for _ in range(20)]
    # An hourly cron instant half an hour away (never reached during the test, whatever the wall-clock
    # minute), brought forward: every timer due two seconds from now. In one transaction, so the
    # running clusters see all of them at once.
    minute = (timezone.now().minute + 30) % 60
    with transaction.atomic():
        timers = [
            timer_create(spec=f"cron:{minute} * * * *", label="每小时", payload="say:tick", session=s, acted_by=SYSTEM)
            for s in sessions
        ]
        due = timezone.now() + timedelta(seconds=2)
        Timer.objects.filter(pk__in=[t.pk for t in timers]).update(next_fire=due)
    assert wait_for(lambda: TimerFiring.objects.filter(status=FiringStatus.DONE).count() >= 20, timeout=40), list(
        TimerFiring.objects.values_list("status", flat=True)
    )
    # Every timer's next instant is ~30 minutes away and each due instant has one firing (unique per
    # timer and instant), all run: no further message can come.
    assert TimerFiring.objects.count() == 20
    assert Message.objects.filter(source_kind=SourceKind.TIMER).count() == 20
    assert sorted(Message.objects.values_list("session_id", flat=True)) == sorted(s.pk for s in sessions)
    for t in Timer.objects.filter(pk__in=[t.pk for t in timers]):
        assert t.status == TimerStatus.ACTIVE and t.fire_count == 1
        assert t.next_fire > due and t.next_fire.second == 0 and t.next_fire.minute == minute


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_offline_a_timer_without_say_is_recorded_as_skipped(make_session, shared_qcluster):
    session = make_session()
    timer = timer_create(spec="1s", label="think", payload="how is the user doing?", session=session, acted_by=SYSTEM)
    assert wait_for(lambda: TimerFiring.objects.filter(timer=timer, status=FiringStatus.SKIPPED).exists())
    assert not Message.objects.filter(session=session).exists()
    cycle = PlannerCycle.objects.get(kind="life", session=session)
    assert cycle.action == "skipped" and "say:" in cycle.error
