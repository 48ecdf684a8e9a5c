"""The dispatcher: claims due work atomically and delivers it, inside the django-q2 cluster process.

django-q2's own scheduler looks at its Schedule rows only every 30 s, so `manage.py qcluster` (our
wrapper, scheduling/management/commands/qcluster.py) runs this loop in a thread beside the cluster.
It sleeps until the next due instant or a wake-up from a write that made work due sooner (scheduling.wakeups;
`poll_interval` is only a long safety poll for a lost wake-up), claims rows
and finishes each claimed batch in one transaction that is valid only while its claim holds, on the
claim machine (chat.claims, whose docstring has the invariants: several clusters may run it at once and
every row is sent exactly once; a dead claimer's rows are taken back once its heartbeat has run out, a
slow one's finish matches no row).

Every instant the dispatcher reads (claim, lease, expiry, backoff, the sent time) comes from a `clock`
(a `now` callable, `timezone.now` by default), so tests drive it in-process with an injected clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from chat import claims
from chat.models import ChatSession, SourceKind
from chat.services import Outbound, messages_prepare, messages_send
from core.config import get_config
from core.process import on_peer_death
from core.retry import backoff, batch_or_each
from scheduling.models import Actor, ScheduledMessage, ScheduledStatus
from scheduling.wakeups import dispatchers_wake

logger = logging.getLogger(__name__)

API = Actor.API.value  # compared once per claimed row: a plain string, not an enum lookup

Clock = Callable[[], datetime]

CLAIMS = claims.ClaimSpec(
    model=ScheduledMessage,
    status="status",
    pending=ScheduledStatus.PENDING.value,
    sending=ScheduledStatus.SENDING.value,
    token="claim_token",
    claimer="claimed_by",
    lease="lease_until",
    attempts="attempts",
    touched="updated_at",
)


@dataclass
class RoundReport:
    claimed: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    expired: int = 0
    recovered: int = 0
    lateness: list[float] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        return bool(self.claimed or self.expired or self.recovered)


class DueSource(Protocol):
    """Something the dispatcher fires when due (scheduled messages; timers)."""

    name: str

    def next_due(self) -> datetime | None: ...

    def run_due(self, now: datetime) -> bool:
        """Do one round of due work; True when there may be more due right now."""
        ...


# --- scheduled messages ---------------------------------------------------------------------------


def expire_overdue(now: datetime) -> int:
    """Fail pending messages that waited past the expiry (e.g. after long downtime)."""
    cutoff = now - timedelta(seconds=get_config().scheduling.expire_after_seconds)
    return claims.expire(
        CLAIMS, age="due_at", before=cutoff, status=ScheduledStatus.FAILED, last_error="expired", updated_at=now
    )


def recover_expired_leases(now: datetime) -> int:
    """Take back rows whose claimer died (its heartbeat ran out) or did not finish within its lease;
    they are due again at once. One UPDATE decides and takes, so clusters doing this at once never
    take a row twice, and a live claimer's rows are left alone until their lease runs out."""
    return claims.end(CLAIMS, claims.abandoned(CLAIMS, now), now=now, status=ScheduledStatus.PENDING, due_at=now)


@dataclass(slots=True)
class ClaimedMessage:
    """A scheduled message as its claim read it: the columns delivery needs, not a model instance
    (building instances was a quarter of the dispatcher's cost for a burst)."""

    pk: str
    created_via: str
    origin: str
    message_text: str
    segments: list
    send_at: datetime
    attempts: int
    session: ChatSession
    lease_until: datetime | None
    sent_at: datetime | None = None
    sent_message_id: int | None = None

    @property
    def lateness_seconds(self) -> float | None:
        return None if self.sent_at is None else (self.sent_at - self.send_at).total_seconds()


_CLAIMED_COLUMNS = ("pk", "created_via", "origin", "message_text", "segments", "send_at", "attempts")
# What the send service reads of a session (its id and its target); the rest is deferred, loaded only
# if something asks for it.
_SESSION_COLUMNS = ("id", "chat_type", "user_id", "group_id")


def claim_due(
    now: datetime, *, limit: int, lease_seconds: float, claimer: str | None = None
) -> tuple[str, list[ClaimedMessage]]:
    """Atomically claim up to `limit` due pending rows. Only rows this call moved to `sending` are
    returned: a concurrent claimer's rows fail the `status='pending'` condition and are skipped.
    `claimer`: the instance the claim is made for (this process's, unless a test stands in for another)."""

    def pick() -> list[str]:
        due = ScheduledMessage.objects.filter(status=ScheduledStatus.PENDING, due_at__lte=now).order_by("due_at")
        return list(due.values_list("pk", flat=True)[:limit])

    return _claim(pick, now=now, lease_seconds=lease_seconds, claimer=claimer)


def _claim(
    pick: claims.Pick, *, now: datetime, lease_seconds: float, claimer: str | None = None
) -> tuple[str, list[ClaimedMessage]]:
    token, taken = claims.claim(CLAIMS, pick, now=now, lease_seconds=lease_seconds, claimer=claimer)
    if not taken:
        return token, []
    lease_until = now + timedelta(seconds=lease_seconds)
    # One query, as with select_related, but as values: one ChatSession per distinct session.
    rows = (
        claims.held(CLAIMS, token)
        .order_by("due_at")
        .values_list(*_CLAIMED_COLUMNS, *(f"session__{c}" for c in _SESSION_COLUMNS))
    )
    sessions: dict[int, ChatSession] = {}
    claimed = []
    width = len(_CLAIMED_COLUMNS)
    for row in rows:
        values = row[width:]
        session = sessions.get(values[0])
        if session is None:
            session = sessions[values[0]] = ChatSession.from_db(connection.alias, _SESSION_COLUMNS, values)
        claimed.append(ClaimedMessage(*row[:width], session, lease_until))
    return token, claimed


def _outbound(task: ClaimedMessage) -> Outbound:
    # A message another system asked for through the API is a proactive message in the chat's
    # history, whether it was sent at once or at its send_at.
    if task.created_via == API:
        source_kind = SourceKind.PROACTIVE.value
        extra = {"scheduled_message_id": task.pk, "origin": task.origin}
    else:
        source_kind = SourceKind.SCHEDULED_SEND.value
        extra = {"scheduled_message_id": task.pk}
    return Outbound(
        session=task.session,
        source_kind=source_kind,
        text=task.message_text,
        segments=list(task.segments),
        extra=extra,
    )


def _finish_batch(token: str, tasks: list[ClaimedMessage], clock: Clock = timezone.now) -> list[ClaimedMessage]:
    """Write the outbound messages and mark the tasks sent, in one transaction, for the rows the
    claim still holds. Returns the tasks sent."""
    # Built before the transaction: on SQLite it holds the one write lock from its start, and the
    # ASGI process claiming what earlier chunks wrote waits for it.
    prepared = messages_prepare([_outbound(t) for t in tasks])
    with transaction.atomic():
        held = set(
            claims.held(CLAIMS, token)
            .select_for_update()
            .filter(pk__in=[t.pk for t in tasks])
            .values_list("pk", flat=True)
        )
        live = [i for i, t in enumerate(tasks) if t.pk in held]
        if not live:
            return []
        messages = messages_send(prepared if len(live) == len(tasks) else prepared.subset(live))
        live = [tasks[i] for i in live]
        now = clock()  # after the outbound rows are written: lateness includes the write
        db_now = connection.ops.adapt_datetimefield_value(now)
        sent = ScheduledStatus.SENT.value
        claims.finish_each(
            CLAIMS,
            token,
            ("status", "sent_message", "sent_at", "last_error", "updated_at"),
            [(sent, m.pk, db_now, "", db_now, t.pk) for t, m in zip(live, messages, strict=True)],
        )
        for task, message in zip(live, messages, strict=True):
            task.sent_message_id, task.sent_at = message.pk, now
    return live


def _fail_or_retry(token: str, task: ClaimedMessage, error: str, clock: Clock = timezone.now) -> str:
    """After a failed attempt: retry later with exponential backoff, or fail for good."""
    cfg = get_config().scheduling
    now = clock()
    error = error[:2000] or "send failed"
    # Read here, not by the claim: only a failed attempt needs it.
    earlier = ScheduledMessage.objects.filter(pk=task.pk).values_list("history", flat=True).first() or []
    history = [*earlier, {"at": now.isoformat(), "event": "attempt_failed", "by": "dispatcher", "error": error}]
    delay = backoff(cfg.retry_backoff_seconds, task.attempts)
    ended = {**CLAIMS.released(), **CLAIMS.stamp(now), "last_error": error, "history": history}
    claims.retry_or_fail(
        claims.held(CLAIMS, token).filter(pk=task.pk),
        attempts=CLAIMS.attempts,
        most=cfg.max_attempts,
        retry={**ended, "status": ScheduledStatus.PENDING, "due_at": now + timedelta(seconds=delay)},
        fail={**ended, "status": ScheduledStatus.FAILED},
    )
    if task.attempts >= cfg.max_attempts:
        logger.error("scheduled message %s failed after %d attempts: %s", task.pk, task.attempts, error)
        return "failed"
    logger.warning("scheduled message %s attempt %d failed (%s); retry in %.1fs", task.pk, task.attempts, error, delay)
    return "retried"


# A claimed batch is written in chunks, each its own transaction: the ASGI process delivers one
# chunk while the next is written. The first is small, so the first messages of a burst go out at once.
FIRST_CHUNK = 100
CHUNK = 500


def _chunks(tasks: list[ClaimedMessage]) -> list[list[ClaimedMessage]]:
    chunks, start, size = [], 0, FIRST_CHUNK
    while start < len(tasks):
        chunks.append(tasks[start : start + size])
        start, size = start + size, CHUNK
    return chunks


def deliver_claimed(token: str, tasks: list[ClaimedMessage], report: RoundReport, clock: Clock = timezone.now) -> None:
    def failed(task: ClaimedMessage, exc: Exception) -> None:
        outcome = _fail_or_retry(token, task, f"{type(exc).__name__}: {exc}", clock)
        setattr(report, outcome, getattr(report, outcome) + 1)

    for chunk in _chunks(tasks):
        # One bad row must not hold back the rest: on failure, one transaction per row.
        done = batch_or_each(
            chunk,
            lambda some: _finish_batch(token, list(some), clock),
            failed=failed,
            logger=logger,
            message="batch delivery failed; delivering %d messages one by one",
        )
        sent = [task for part in done for task in part]
        report.sent += len(sent)
        report.lateness.extend(t.lateness_seconds for t in sent)


def deliver_due(now: datetime | None = None, *, clock: Clock = timezone.now) -> RoundReport:
    """One dispatcher round for scheduled messages: expire, recover leases, claim, deliver. `now` (the
    round's instant) defaults to `clock()`; the sent time and retry times are read from `clock`."""
    cfg = get_config().scheduling
    now = now or clock()
    report = RoundReport()
    report.expired = expire_overdue(now)
    report.recovered = recover_expired_leases(now)
    token, tasks = claim_due(now, limit=cfg.batch_size, lease_seconds=cfg.lease_seconds)
    report.claimed = len(tasks)
    if tasks:
        deliver_claimed(token, tasks, report, clock)
    if report.expired:
        logger.warning("%d overdue scheduled messages expired", report.expired)
    if report.recovered:
        logger.warning("%d scheduled messages taken back from a dead cluster (or one past its lease)", report.recovered)
    return report


def deliver_one(task_id: str, *, now: datetime | None = None, clock: Clock = timezone.now) -> RoundReport:
    """Claim one pending row and deliver it in this process: the API's "send now", which answers
    only once the message is in the outbox. Same claim and finish as the loop, so it is sent once
    even if a dispatcher sees the row at the same moment."""
    cfg = get_config().scheduling
    now = now or clock()
    report = RoundReport()
    try:
        token, tasks = _claim([task_id], now=now, lease_seconds=cfg.lease_seconds)
        report.claimed = len(tasks)
        if tasks:
            deliver_claimed(token, tasks, report, clock)
    finally:
        if not report.sent:
            # Not sent here (a retry later, a failure, another claimer): no dispatcher knows of the row's
            # due time yet, since its creation woke none (scheduling.wakeups).
            dispatchers_wake()
    return report


class ScheduledMessageSource:
    name = "scheduled_messages"

    def __init__(self, clock: Clock = timezone.now) -> None:
        self.clock = clock

    def next_due(self) -> datetime | None:
        # ORDER BY … LIMIT 1 rather than MIN(): SQLite answers MIN(due_at) WHERE status = … by reading
        # every pending row of the (status, due_at) index, and the look-ahead runs every tick.
        due = (
            ScheduledMessage.objects.filter(status=ScheduledStatus.PENDING)
            .order_by("due_at")
            .values_list("due_at", flat=True)
            .first()
        )
        lease = (
            ScheduledMessage.objects.filter(status=ScheduledStatus.SENDING)
            .order_by("lease_until")
            .values_list("lease_until", flat=True)
            .first()
        )
        candidates = [d for d in (due, lease) if d is not None]
        return min(candidates) if candidates else None

    def run_due(self, now: datetime) -> bool:
        report = deliver_due(now, clock=self.clock)
        return report.claimed >= get_config().scheduling.batch_size or report.recovered > 0


# Other apps add their sources here (timers) at import time of their dispatcher module.
SOURCES: list[DueSource] = [ScheduledMessageSource()]


def register_source(source: DueSource) -> None:
    if all(s.name != source.name for s in SOURCES):
        SOURCES.append(source)


# After a source failed (a lost database connection): look again after this, not at once (no spinning).
FAILURE_BACKOFF_SECONDS = 1.0


class Dispatcher:
    """The loop: run due sources, then wait until the next due instant, a wake-up, or the safety poll.

    It never polls for work: every service that makes work due sooner wakes it (scheduling.wakeups, through
    the notifier's `dispatcher_inbox`), a process whose heartbeat runs out wakes it (its claims can be
    taken back: core.process.on_peer_death), and the instants it already knows (the next due row, the
    next lease to run out, a timer's next fire) it sleeps until. `scheduling.poll_interval` (30 s) is only
    the safety net for a lost wake-up."""

    def __init__(
        self,
        sources: list[DueSource] | None = None,
        stop_event: threading.Event | None = None,
        clock: Clock = timezone.now,
    ) -> None:
        self.sources = sources if sources is not None else SOURCES
        self.stop_event = stop_event or threading.Event()
        self.clock = clock
        self.inbox = None  # the notifier's DueInbox while run_forever runs
        self.rounds = 0  # loop rounds run (tests)
        self.woken = 0  # waits ended by a wake-up rather than a due instant or the safety poll (tests)

    def tick(self) -> bool:
        """Run every source once; True when some source may have more due work right now."""
        more = False
        for source in self.sources:
            try:
                more |= source.run_due(self.clock())
            except Exception:
                # A broken source (or a lost database connection) must not spin: back off a moment.
                logger.exception("dispatcher source %s failed", source.name)
                close_old_connections()
                self.stop_event.wait(FAILURE_BACKOFF_SECONDS)
        return more

    def seconds_to_sleep(self) -> float:
        poll = get_config().scheduling.poll_interval
        soonest = None
        for source in self.sources:
            try:
                due = source.next_due()
            except Exception:
                logger.exception("dispatcher source %s: next_due failed", source.name)
                close_old_connections()
                return FAILURE_BACKOFF_SECONDS
            if due is not None and (soonest is None or due < soonest):
                soonest = due
        if soonest is None:
            return poll
        return max(0.0, min(poll, (soonest - self.clock()).total_seconds()))

    def run_forever(self) -> None:
        from chat.notify import get_notifier

        # Open before the first look for work: a wake-up sent after that is never missed.
        self.inbox = get_notifier().dispatcher_inbox()
        how = self.inbox.open()
        forget = on_peer_death(self.inbox.wake)
        logger.info("dispatcher started (sources: %s; %s)", ", ".join(s.name for s in self.sources), how)
        try:
            while not self.stop_event.is_set():
                self.rounds += 1
                if self.tick():
                    continue
                self.woken += self.inbox.wait(self.seconds_to_sleep())
        finally:
            forget()
            self.inbox.close()
            close_old_connections()
        logger.info("dispatcher stopped")

    def stop(self) -> None:
        self.stop_event.set()
        if self.inbox is not None:
            self.inbox.wake()
