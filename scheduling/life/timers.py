"""Timers: every write to them (create, cancel, fire now, change the spec) and their firing by the
dispatcher (TimerSource), which claims each due instant exactly once and hands it to a worker.

Firing: the dispatcher thread finds the due (instant, spec) groups and claims each with ONE
conditional UPDATE (… WHERE status = 'active' AND next_fire = <that instant> AND spec = …) that
advances next_fire (or ends a one-shot timer) and stamps a claim token; in the same transaction an
INSERT … SELECT records a TimerFiring for every row it advanced. Another cluster's UPDATE for the same
instant finds next_fire already moved and matches nothing; the unique (timer, due_at) constraint
backs this up in the database. After commit the firings go to the django-q2 queue
(scheduling.life.loop.run_firing) from a hand-off thread, so the dispatcher never waits on a model.
A repeating timer that missed periods (downtime) fires once and moves to its next future time.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from chat.models import ChatSession
from core.config import format_instant, get_config
from scheduling.life.error_codes import LifeError, TimerErrorCode
from scheduling.life.models import FiringStatus, Timer, TimerFiring, TimerStatus
from scheduling.models import Actor
from scheduling.services import ActedBy
from scheduling.timespec import TimerSpec, TimeSpecError, parse_timer_spec
from scheduling.wakeups import dispatchers_wake_on_commit

logger = logging.getLogger(__name__)

Code = TimerErrorCode


def timer_spec(spec: str) -> TimerSpec:
    """Parse a spec in the bot's time zone; LifeError(invalid_spec) naming the problem."""
    try:
        return parse_timer_spec(spec, get_config().tzinfo)
    except TimeSpecError as exc:
        raise LifeError(Code.INVALID_SPEC, str(exc)) from None
    except AttributeError:
        raise LifeError(Code.INVALID_SPEC, "spec must be a string such as 5min or cron:0 8 * * *") from None


def timer_first_fire(spec: TimerSpec, now: datetime) -> datetime:
    """When a timer set now with this spec fires first: in the future, within the horizon."""
    cfg = get_config()
    when = spec.first_fire(now, cfg.tzinfo)
    if when <= now:
        raise LifeError(
            Code.INVALID_SPEC,
            f"{spec.text} is in the past (now is {format_instant(now, cfg.tzinfo)})",
        )
    if when - now > timedelta(days=cfg.scheduling.horizon_days):
        raise LifeError(Code.INVALID_SPEC, f"{spec.text} is more than {cfg.scheduling.horizon_days} days ahead")
    return when


def timer_clean_fields(label: str, payload: str) -> tuple[str, str]:
    """A timer's label and payload, stripped and checked (LifeError naming the problem)."""
    cfg = get_config().life
    label = (label or "").strip() if isinstance(label, str) else ""
    payload = (payload or "").strip() if isinstance(payload, str) else ""
    if not label:
        raise LifeError(Code.EMPTY_LABEL, "a timer needs a label saying what it is for")
    limit = Timer._meta.get_field("label").max_length
    if len(label) > limit:
        raise LifeError(Code.LABEL_TOO_LONG, f"label has {len(label)} characters; the limit is {limit}")
    if len(payload) > cfg.max_payload_length:
        raise LifeError(
            Code.PAYLOAD_TOO_LONG, f"payload has {len(payload)} characters; the limit is {cfg.max_payload_length}"
        )
    return label, payload


def timer_create(
    *,
    spec: str,
    label: str,
    acted_by: ActedBy,
    payload: str = "",
    session: ChatSession | None = None,
    now: datetime | None = None,
) -> Timer:
    """Set a timer (for a chat, or the bot's own when session is None). Raises LifeError."""
    now = now or timezone.now()
    label, payload = timer_clean_fields(label, payload)
    parsed = timer_spec(spec)
    first = timer_first_fire(parsed, now)
    limit = get_config().life.max_timers_per_session
    try:
        with transaction.atomic():
            if session is not None:
                active = Timer.objects.filter(session=session, status=TimerStatus.ACTIVE).count()
                if active >= limit:
                    raise LifeError(
                        Code.TOO_MANY_TIMERS, f"this chat already has {limit} active timers; cancel one first"
                    )
            timer = Timer(
                label=label,
                payload=payload,
                spec=parsed.text,
                kind=parsed.kind,
                session=session,
                next_fire=first,
                created_via=acted_by.via,
                created_by_tool_call_id=acted_by.tool_call_id,
                created_by_user=acted_by.user,
            )
            timer.full_clean()
            timer.save(force_insert=True)
            dispatchers_wake_on_commit()
    except LifeError:
        raise
    except DatabaseError as exc:
        logger.exception("could not store a timer")
        raise LifeError(Code.STORAGE_ERROR, f"the timer could not be stored: {exc}") from exc
    return timer


def _active_for_update(timer_id: str, session: ChatSession | None = None) -> Timer:
    qs = Timer.objects.select_for_update().filter(pk=timer_id)
    if session is not None:
        qs = qs.filter(session=session)
    timer = qs.first()
    if timer is None:
        where = " in this chat" if session is not None else ""
        raise LifeError(Code.NOT_FOUND, f"no timer {timer_id!r}{where}")
    if timer.status != TimerStatus.ACTIVE:
        raise LifeError(Code.NOT_ACTIVE, f"timer {timer_id} is {timer.status}, not active")
    return timer


def timer_cancel(
    *, timer_id: str, acted_by: ActedBy, session: ChatSession | None = None, now: datetime | None = None
) -> Timer:
    """Cancel an active timer (within `session` when given); it stays as history."""
    now = now or timezone.now()
    with transaction.atomic():
        timer = _active_for_update(str(timer_id), session)
        updated = Timer.objects.filter(pk=timer.pk, status=TimerStatus.ACTIVE).update(
            status=TimerStatus.CANCELLED, cancelled_at=now, next_fire=None, updated_at=now
        )
        if not updated:
            raise LifeError(Code.NOT_ACTIVE, f"timer {timer_id} changed meanwhile")
    logger.info("timer %s cancelled by %s", timer_id, acted_by.describe())
    timer.refresh_from_db()
    return timer


def timer_fire_now(*, timer_id: str, acted_by: ActedBy, now: datetime | None = None) -> Timer:
    """Make an active timer due at once; the dispatcher fires it on its next round, as any due timer."""
    now = now or timezone.now()
    with transaction.atomic():
        timer = _active_for_update(timer_id)
        Timer.objects.filter(pk=timer.pk, status=TimerStatus.ACTIVE).update(next_fire=now, updated_at=now)
        dispatchers_wake_on_commit()
    logger.info("timer %s fired now by %s", timer_id, acted_by.describe())
    timer.refresh_from_db()
    return timer


def timer_update(
    *,
    timer_id: str,
    acted_by: ActedBy,
    spec: str | None = None,
    label: str | None = None,
    payload: str | None = None,
    now: datetime | None = None,
) -> Timer:
    """Change an active timer's spec (its next fire is computed afresh), label or payload."""
    now = now or timezone.now()
    with transaction.atomic():
        timer = _active_for_update(timer_id)
        label, payload = timer_clean_fields(
            timer.label if label is None else label, timer.payload if payload is None else payload
        )
        changes: dict[str, Any] = {"label": label, "payload": payload, "updated_at": now}
        if spec is not None and spec.strip() != timer.spec:
            parsed = timer_spec(spec)
            changes.update(spec=parsed.text, kind=parsed.kind, next_fire=timer_first_fire(parsed, now))
        Timer.objects.filter(pk=timer.pk, status=TimerStatus.ACTIVE).update(**changes)
        if "next_fire" in changes:
            dispatchers_wake_on_commit()
    logger.info("timer %s updated by %s: %s", timer_id, acted_by.describe(), sorted(changes))
    timer.refresh_from_db()
    return timer


# --- selectors ------------------------------------------------------------------------------------


def timers_active(*, session: ChatSession | None) -> list[Timer]:
    return list(Timer.objects.filter(session=session, status=TimerStatus.ACTIVE).order_by("next_fire"))


def timer_upcoming(timer: Timer, count: int = 5, now: datetime | None = None) -> list[datetime]:
    """The next fires of an active timer (admin preview)."""
    if timer.status != TimerStatus.ACTIVE or timer.next_fire is None:
        return []
    tz = get_config().tzinfo
    spec = parse_timer_spec(timer.spec, tz)
    out = [timer.next_fire]
    while len(out) < count:
        nxt = spec.next_fire(out[-1], out[-1], tz)
        if nxt is None:
            break
        out.append(nxt)
    return out


def timer_as_dict(timer: Timer) -> dict[str, Any]:
    """The public shape of a timer (tool results)."""
    tz = get_config().tzinfo
    return {
        "timer_id": timer.pk,
        "label": timer.label,
        "payload": timer.payload,
        "spec": timer.spec,
        "kind": timer.kind,
        "status": timer.status,
        "next_fire": format_instant(timer.next_fire, tz) if timer.next_fire else None,
        "fire_count": timer.fire_count,
    }


# --- firing (dispatcher side) ---------------------------------------------------------------------


def fire_due(now: datetime, *, limit: int) -> tuple[int, list[int]]:
    """Claim the due timer instants (at most `limit` distinct (instant, spec) groups per call);
    returns (groups seen due, ids of the firings this call recorded).

    Timers due at the same instant with the same spec (10,000 `cron:* * * * *` at one minute) are one
    group: one UPDATE claims them all and one INSERT … SELECT records their firings."""
    tz = get_config().tzinfo
    groups = list(
        Timer.objects.filter(status=TimerStatus.ACTIVE, next_fire__lte=now)
        .order_by("next_fire")
        .values_list("next_fire", "spec")
        .distinct()[:limit]
    )
    if not groups:
        return 0, []
    firing_ids: list[int] = []
    with transaction.atomic():
        for instant, spec in groups:
            try:
                nxt = _parse_repeating(spec, tz).next_fire(instant, now, tz) if _repeats(spec) else None
            except TimeSpecError as exc:
                # A spec that no longer parses (e.g. edited in the database): stop, say why.
                Timer.objects.filter(status=TimerStatus.ACTIVE, next_fire=instant, spec=spec).update(
                    status=TimerStatus.FAILED, next_fire=None, last_error=str(exc), updated_at=now
                )
                continue
            token = uuid.uuid4().hex
            # The claim: only rows still active at this instant move. A concurrent claimer that got
            # there first already moved them, so its rows no longer match and nothing fires twice.
            if _claim_instant(instant=instant, spec=spec, next_fire=nxt, token=token, now=now):
                # fired_at: when the claim was made, not when the round began (honest lateness).
                firing_ids.extend(_record_firings(token, instant, timezone.now()))
    return len(groups), firing_ids


def _claim_instant(*, instant: datetime, spec: str, next_fire: datetime | None, token: str, now: datetime) -> int:
    """One conditional UPDATE: advance every active timer due at `instant` with `spec` to `next_fire`
    (or end it, for None) and stamp the claim token. Plain SQL: this is the dispatcher's hot path,
    run once per distinct due instant, and the ORM's per-call compile cost several times the UPDATE."""
    timer = Timer._meta.db_table
    at = connection.ops.adapt_datetimefield_value
    status = TimerStatus.ACTIVE if next_fire is not None else TimerStatus.DONE
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {timer} SET fire_token = %s, last_fired_at = %s, fire_count = fire_count + 1, "
            "updated_at = %s, next_fire = %s, status = %s "
            "WHERE status = %s AND next_fire = %s AND spec = %s",
            [token, at(now), at(now), at(next_fire), status.value, TimerStatus.ACTIVE.value, at(instant), spec],
        )
        return cursor.rowcount


def _record_firings(token: str, instant: datetime, now: datetime) -> list[int]:
    """One firing per row the claim stamped with `token`, written by one INSERT … SELECT … RETURNING
    (SQLite ≥ 3.35, PostgreSQL): building thousands of model instances for bulk_create costs several
    times the claim itself. ON CONFLICT keeps an instant from ever being recorded twice."""
    firing, timer = TimerFiring._meta.db_table, Timer._meta.db_table
    due_at, fired_at = (connection.ops.adapt_datetimefield_value(v) for v in (instant, now))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {firing} (timer_id, due_at, fired_at, status, outcome, error) "
            f"SELECT id, %s, %s, %s, '', '' FROM {timer} WHERE fire_token = %s "
            "ON CONFLICT DO NOTHING RETURNING id",
            [due_at, fired_at, FiringStatus.PENDING.value, token],
        )
        return [row[0] for row in cursor.fetchall()]


@functools.lru_cache(maxsize=4096)
def _repeats(spec: str) -> bool:
    return spec.lower().startswith(("cron:", "every:"))


@functools.lru_cache(maxsize=4096)
def _parse_repeating(spec: str, tz: tzinfo) -> TimerSpec:
    # A cron or every: spec means the same whenever it is read: parse each once, not once per fire.
    return parse_timer_spec(spec, tz)


def enqueue_firings(firing_ids: list[int]) -> None:
    """Hand firings to the django-q2 workers; each runs one life-loop turn. One transaction for the
    lot: with the ORM broker every enqueue is a write, and one commit per task costs tens of ms."""
    from django_q.brokers import get_broker
    from django_q.tasks import async_task

    broker = get_broker()
    with transaction.atomic():
        for firing_id in firing_ids:
            async_task(
                "scheduling.life.loop.run_firing",
                firing_id,
                group="life",
                task_name=f"life-firing-{firing_id}",
                broker=broker,
            )
        TimerFiring.objects.filter(pk__in=firing_ids).update(enqueued_at=timezone.now())


class FiringHandOff:
    """Enqueues claimed firings from a thread of its own, in chunks, so the dispatcher thread goes
    straight back to claiming (10,000 firings due at one minute take seconds to enqueue). A chunk
    lost here (crash, broker down) is picked up again by requeue_stale_firings."""

    chunk = 100  # short transactions: each holds the SQLite write lock the dispatcher claims with

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, firing_ids: list[int]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="maibot-firing-handoff", daemon=True)
                self._thread.start()
        self._queue.put(list(firing_ids))

    def _run(self) -> None:
        while True:
            ids = self._queue.get()
            while len(ids) < self.chunk:
                try:
                    ids.extend(self._queue.get_nowait())
                except queue.Empty:
                    break
            # Short transactions: on SQLite a long one would hold up the dispatcher's next claims.
            for start in range(0, len(ids), self.chunk):
                chunk = ids[start : start + self.chunk]
                try:
                    enqueue_firings(chunk)
                except Exception:
                    logger.exception("could not enqueue %d timer firings; they will be handed over again", len(chunk))
                    close_old_connections()


# A firing claimed but never enqueued (the cluster died in between) waits this long before it is
# handed over again; longer than a 10,000-firing burst takes to enqueue.
UNENQUEUED_GRACE = timedelta(seconds=30)
# The upkeep's conditions are strict (`enqueued_at < cutoff`): the dispatcher looks just past the instant.
JUST_PAST = timedelta(milliseconds=1)


def requeue_stale_firings(now: datetime) -> int:
    """Firings no worker started (lost by the broker, or the cluster died before enqueueing) go back
    to the queue; the worker's own claim makes a duplicate harmless."""
    cutoff = now - timedelta(seconds=get_config().life.firing_requeue_seconds)
    stale = list(
        TimerFiring.objects.filter(status=FiringStatus.PENDING)
        .filter(Q(enqueued_at__lt=cutoff) | Q(enqueued_at__isnull=True, fired_at__lt=now - UNENQUEUED_GRACE))
        .values_list("pk", flat=True)[:500]
    )
    if stale:
        logger.warning("re-enqueueing %d timer firings no worker started", len(stale))
        enqueue_firings(stale)
    return len(stale)


def fail_lost_turns(now: datetime) -> int:
    """A running turn far past its hard timeout belongs to a dead worker: fail it, never re-run it
    (it may already have sent a message)."""
    cutoff = now - timedelta(seconds=get_config().life.turn_timeout + 60)
    return TimerFiring.objects.filter(status=FiringStatus.RUNNING, started_at__lt=cutoff).update(
        status=FiringStatus.FAILED, error="worker lost during the turn", finished_at=now
    )


class TimerSource:
    """The dispatcher's due source for timers."""

    name = "timers"
    maintenance_every = 5.0

    def __init__(self, enqueue: Callable[[list[int]], None] | None = None) -> None:
        self.enqueue = enqueue or enqueue_firings
        self._last_maintenance: datetime | None = None
        self._claimed: list[int] = []

    def next_due(self) -> datetime | None:
        # ORDER BY … LIMIT 1: SQLite answers MIN() WHERE status = … by reading every active timer.
        fire = (
            Timer.objects.filter(status=TimerStatus.ACTIVE, next_fire__isnull=False)
            .order_by("next_fire")
            .values_list("next_fire", flat=True)
            .first()
        )
        upkeep = self._upkeep_due()
        return min((d for d in (fire, upkeep) if d is not None), default=None)

    def _upkeep_due(self) -> datetime | None:
        """When the next firing in progress becomes stale (requeue_stale_firings) or a turn lost
        (fail_lost_turns): the dispatcher sleeps until then, not polls. Never before the next maintenance
        round may run (no spinning on one it could not settle). One query over the firings in progress
        (a handful: the status index)."""
        life = get_config().life
        requeue, lost = timedelta(seconds=life.firing_requeue_seconds), timedelta(seconds=life.turn_timeout + 60)
        instants = []
        in_progress = TimerFiring.objects.filter(status__in=[FiringStatus.PENDING, FiringStatus.RUNNING])
        for status, fired_at, enqueued_at, started_at in in_progress.values_list(
            "status", "fired_at", "enqueued_at", "started_at"
        ):
            if status == FiringStatus.RUNNING:
                if started_at is not None:  # a running turn always has one (the worker's claim sets it)
                    instants.append(started_at + lost)
            else:
                instants.append(enqueued_at + requeue if enqueued_at else fired_at + UNENQUEUED_GRACE)
        if not instants:
            return None
        due = min(instants) + JUST_PAST
        if self._last_maintenance is not None:
            due = max(due, self._last_maintenance + timedelta(seconds=self.maintenance_every))
        return due

    def run_due(self, now: datetime) -> bool:
        limit = get_config().scheduling.batch_size
        seen, firing_ids = fire_due(now, limit=limit)
        if firing_ids:
            logger.info("fired %d timers", len(firing_ids))
            self._claimed.extend(firing_ids)
        more = seen >= limit
        # While a burst is being claimed, enqueueing would compete with the claims for the database
        # (one writer on SQLite): claim the whole burst first, then hand it over.
        if self._claimed and (not more or len(self._claimed) >= 20 * limit):
            claimed, self._claimed = self._claimed, []
            self.enqueue(claimed)
        if self._last_maintenance is None or (now - self._last_maintenance).total_seconds() >= self.maintenance_every:
            self._last_maintenance = now
            requeue_stale_firings(now)
            if lost := fail_lost_turns(now):
                logger.warning("%d life-loop turns lost with their worker", lost)
        return more


def actor_tool(tool_call_id: str) -> ActedBy:
    return ActedBy(via=Actor.TOOL, tool_call_id=tool_call_id)
