"""The outbox's rows: claiming due outbound Message rows with the frames to write (built by
chat.wire.outbound), recording what became of them, and the sweep. Sync services; the deliverer
(chat.outbox) calls them on a thread of its own.

Rows move on the claim machine (chat.claims, whose docstring holds the invariants: who may write a
claimed row, what a lease means, why no row is handed over by two processes): pending → sending with a
claim token, the claiming process's instance and a lease of `gateway.delivery_lease_seconds`. Each
process claims only rows it can deliver (the platforms, and the browser users, connected to it, as its
delivery gate lets them: chat.delivery_gate). A row is marked sent once its frame has been handed to the
socket, delivered when the adapter's `message_id_echo` names it (chat.ingest). Rows waiting for an
offline adapter longer than `gateway.offline_expiry_seconds` fail with `adapter_offline`.

Two delivery guarantees, by what the platform's adapter has shown (chat.delivery_gate):
- A platform whose adapter has never echoed: at most once. A row whose claimer died mid-send (or ran
  out its lease) fails with `delivery_interrupted` rather than risk a second copy on the platform.
  (While such a platform is unproven its rows go one at a time with a confirm deadline, which shows
  whether it echoes; the one exception to at most once is a probe handed over again on a connection
  that followed an outage: chat.delivery_gate.)
- A platform whose adapter echoes: a sent row carries its confirm deadline in `next_attempt_at`; with
  no echo by then it is pending again and handed over again, oldest first, `gateway.max_delivery_attempts`
  hand-overs in all, then `unconfirmed` (`no_echo`). A row left `sending` by a dead claimer is treated
  the same way. The price: a platform that delivered but whose echo was lost gets the message again
  (never more often than the attempt limit).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from chat import claims, send_hooks
from chat.delivery_errors import HELD, DeliveryError
from chat.delivery_gate import confirm_deadlines, outbox_confirm_overdue, platforms_that_echo
from chat.models import AdapterConnection, ChatSession, DeliveryStatus, Direction, Message
from chat.wire.outbound import adapter_envelope, browser_frame
from core.config import get_config

logger = logging.getLogger(__name__)

WEB_PLATFORM = "web"
# Rows per claim: the size of one claim's statements, tuned with bench/ingest.py, not an operator's
# choice (a round that fills it claims again at once).
BATCH_SIZE = 500
# The session columns adapter_envelope and browser_frame read.
FRAME_SESSION_FIELDS = (
    "session_id", "platform", "chat_type", "user_id", "user_nickname", "user_cardname", "group_id", "group_name",
)  # fmt: skip

CLAIMS = claims.ClaimSpec(
    model=Message,
    status="delivery_status",
    pending=DeliveryStatus.PENDING.value,
    sending=DeliveryStatus.SENDING.value,
    token="delivery_claim",
    claimer="delivery_claimed_by",
    lease="delivery_lease_until",
    attempts="delivery_attempts",
)


@dataclass
class Delivery:
    """One claimed row, with the frame to write and where to write it."""

    message_id: int
    platform: str
    session_id: str
    user_id: str  # the browser user for platform `web`
    frame: dict[str, Any] | None
    error: DeliveryError | None = None
    # Hand-overs including this one.
    attempts: int = 1


@dataclass(frozen=True)
class Answered:
    """What an adapter that answers each hand-over (an adapter plugin's message gateway) said of one row:
    `ok` with the platform's message id (delivered; an empty id: sent, unconfirmed), or the `reason` it
    failed (the row is handed over again after its confirm window, within gateway.max_delivery_attempts,
    then failed with that reason)."""

    ok: bool
    platform_id: str = ""
    reason: str = ""


class OutboundRow(NamedTuple):
    """The columns of an outbound message that delivery needs."""

    id: int
    uid: uuid.UUID
    session_id: int
    direction: str
    source_kind: str
    text: str
    segments: list
    time: datetime
    delivery_attempts: int


def outbox_claim(
    *,
    adapter_platforms: Collection[str],
    web_users: Collection[str],
    accept_formats: Mapping[str, list[str]],
    probing: Collection[str] = (),
    limit: int = BATCH_SIZE,
    lease_seconds: float | None = None,
    now: datetime | None = None,
    claimer: str | None = None,
) -> tuple[str, list[Delivery]]:
    """Claim up to `limit` due pending rows this process can deliver, oldest first, with their frames.

    `probing`: platforms whose connection may take one row only (the oldest due), the gate after a
    (re)connect; `adapter_platforms` take whatever is due. `claimer`: the instance the claim is made
    for (this process's, core.process.instance_id, unless a test stands in for another).
    """
    config = get_config().gateway
    now = now or timezone.now()
    # Rows past the offline expiry are never sent, even before the sweep has marked them failed; rows
    # waiting out a redelivery backoff are not due yet.
    cutoff = now - timedelta(seconds=config.offline_expiry_seconds)
    due = (
        Message.objects.filter(
            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
            delivery_status=DeliveryStatus.PENDING,
            created_at__gte=cutoff,
        )
        .exclude(delivery_error=HELD)
        .order_by("id")
    )  # held for send_service.before_send (chat.send_hooks)
    platforms = [p for p in adapter_platforms if p != WEB_PLATFORM]

    def pick() -> list[int]:
        ids: list[int] = []
        if platforms or web_users:
            target = Q(session__platform__in=platforms)
            if web_users:
                target |= Q(session__platform=WEB_PLATFORM, session__user_id__in=list(web_users))
            ids = list(due.filter(target).values_list("id", flat=True)[:limit])
        for platform in probing:
            first = due.filter(session__platform=platform).values_list("id", flat=True).first()
            if first is not None:
                ids.append(first)
        return ids

    lease = config.delivery_lease_seconds if lease_seconds is None else lease_seconds
    token, taken = claims.claim(CLAIMS, pick, now=now, lease_seconds=lease, claimer=claimer)
    if not taken:
        return token, []
    # Plain tuples, not model instances: building two instances per row was most of a claim's cost.
    rows = [
        OutboundRow(*values) for values in claims.held(CLAIMS, token).order_by("id").values_list(*OutboundRow._fields)
    ]
    return token, _deliveries(rows, accept_formats)


def _deliveries(rows: list[OutboundRow], accept_formats: Mapping[str, list[str]]) -> list[Delivery]:
    """The claimed rows with their frames (a row whose frame cannot be built carries its error)."""
    # Only what the frames need: a session's other columns (times) cost a conversion per row read.
    sessions = ChatSession.objects.only(*FRAME_SESSION_FIELDS).in_bulk({row.session_id for row in rows})
    deliveries = []
    for row in rows:
        session = sessions[row.session_id]
        try:
            if session.platform == WEB_PLATFORM:
                frame, error = browser_frame(row), None
            else:
                frame, error = adapter_envelope(row, session, accept_formats.get(session.platform))
        except Exception:
            # One unbuildable row fails alone; it must not hold back the rest of the outbox.
            logger.exception("outbound message %s cannot be turned into a frame", row.id)
            frame, error = {}, DeliveryError.BAD_MESSAGE
        deliveries.append(
            Delivery(
                message_id=row.id,
                platform=session.platform,
                session_id=session.session_id,
                user_id=session.user_id,
                frame=frame or None,
                error=error,
                attempts=row.delivery_attempts,
            )
        )
    return deliveries


def outbox_finish(
    *,
    token: str,
    sent: Collection[int],
    released: Collection[int],
    failed: dict[int, DeliveryError],
    awaiting_echo: Collection[int] = (),
    answered: Mapping[int, tuple[str, Answered]] | None = None,
    now: datetime | None = None,
) -> None:
    """Record a claimed batch's outcome: sent rows get sent_at (those in `awaiting_echo`, of platforms
    that echo, also their confirm deadline), released rows wait again; `answered` rows (by id: their
    platform and the adapter's answer) take the answer as their fate (`_finish_answered`)."""
    now = now or timezone.now()
    if answered:
        _finish_answered(token, answered, now)
    confirmed = set(awaiting_echo) & set(sent)
    handed = {"delivery_status": DeliveryStatus.SENT, "sent_at": now}
    claims.finish(CLAIMS, token, [i for i in sent if i not in confirmed], **handed, next_attempt_at=None)
    if confirmed:
        claims.finish(CLAIMS, token, list(confirmed), **handed, next_attempt_at=confirm_deadlines(now))
    # Claimed but not handed over: the claim's attempt did not happen.
    claims.finish(
        CLAIMS,
        token,
        list(released),
        delivery_status=DeliveryStatus.PENDING,
        delivery_attempts=F("delivery_attempts") - 1,
    )
    for message_id, error in failed.items():
        claims.finish(
            CLAIMS,
            token,
            [message_id],
            delivery_status=DeliveryStatus.FAILED,
            delivery_error=error,
            next_attempt_at=None,
        )
        logger.warning("outbound message %s failed: %s", message_id, error)


def _finish_answered(token: str, answered: Mapping[int, tuple[str, Answered]], now: datetime) -> None:
    """The fate an answering adapter gave each row (Answered): delivered with the platform's id (which,
    like an echo, marks its platform as one that confirms), sent without one, or pending again after
    its confirm window with the reason kept, `failed` with it once gateway.max_delivery_attempts
    hand-overs are spent."""
    from chat.ingest import adapter_platforms_echoed  # chat.ingest imports the delivery gate, not this

    confirmed: set[str] = set()
    for message_id, (platform, answer) in answered.items():
        if answer.ok:
            fields: dict[str, Any] = {"delivery_status": DeliveryStatus.SENT, "sent_at": now, "next_attempt_at": None}
            if answer.platform_id:
                fields.update(
                    delivery_status=DeliveryStatus.DELIVERED,
                    delivered_at=now,
                    platform_message_id=answer.platform_id[:128],
                    delivery_error="",
                )
                confirmed.add(platform)
            claims.finish(CLAIMS, token, [message_id], **fields)
            continue
        reason = f"{DeliveryError.GATEWAY_FAILED}: {answer.reason or 'no reason given'}"[:255]
        retried, _ = claims.retry_or_fail(
            claims.held(CLAIMS, token).filter(pk=message_id),
            attempts=CLAIMS.attempts,
            most=get_config().gateway.max_delivery_attempts,
            retry={
                **CLAIMS.released(),
                "delivery_status": DeliveryStatus.PENDING,
                "next_attempt_at": confirm_deadlines(now),
                "delivery_error": reason,
            },
            fail={
                **CLAIMS.released(),
                "delivery_status": DeliveryStatus.FAILED,
                "next_attempt_at": None,
                "delivery_error": reason,
            },
        )
        logger.warning("outbound message %s %s (%s)", message_id, "to be retried" if retried else "failed", reason)
    if confirmed:
        adapter_platforms_echoed(platforms=confirmed, now=now)


def outbox_sweep(*, now=None) -> tuple[int, int]:
    """Fail rows that waited past the offline expiry. Take back the abandoned claims (chat.claims:
    dead claimers, claims past their lease): such a row fails too, or, on a platform that echoes,
    counts as sent without an echo (handed over again within the attempt limit).
    Rows whose echo is overdue on a platform that echoes and has no open adapter connection are settled
    here too, one lease after their deadline (a process holding the platform's connection settles them
    at once); an unproven platform's are settled by its next connection (chat.delivery_gate)."""
    now = now or timezone.now()
    config = get_config().gateway
    expired = claims.expire(
        CLAIMS,
        age="created_at",
        before=now - timedelta(seconds=config.offline_expiry_seconds),
        scope=Q(direction=Direction.OUT),
        delivery_status=DeliveryStatus.FAILED,
        delivery_error=DeliveryError.ADAPTER_OFFLINE,
        next_attempt_at=None,
    )
    send_hooks.sweep(now)
    resent, unconfirmed, interrupted = _take_back_abandoned(now)
    grace = now - timedelta(seconds=config.delivery_lease_seconds)
    overdue = Message.objects.filter(delivery_status=DeliveryStatus.SENT, next_attempt_at__lte=grace)
    if overdue.exists():
        connected = AdapterConnection.objects.filter(disconnected_at__isnull=True).values_list("platform", flat=True)
        # An unproven platform's probe is not handed over again: its next connection settles it.
        orphans = overdue.exclude(session__platform__in=list(connected)).filter(
            session__platform__in=platforms_that_echo()
        )
        if orphans.exists():
            outbox_confirm_overdue(platforms=set(orphans.values_list("session__platform", flat=True)), now=grace)
    if expired:
        logger.warning("%d outbound messages failed: adapter offline longer than the expiry", expired)
    if interrupted:
        logger.warning(
            "%d outbound messages failed: their sender died (or ran out its lease) mid-send; not resent", interrupted
        )
    if resent or unconfirmed:
        logger.warning(
            "%d outbound messages taken back from a dead (or stuck) sender: %d to be handed over again, %d unconfirmed",
            resent + unconfirmed,
            resent,
            unconfirmed,
        )
    return expired, interrupted


def _take_back_abandoned(now: datetime) -> tuple[int, int, int]:
    """The abandoned claims, ended: (pending again, unconfirmed, failed as interrupted)."""
    dead = claims.abandoned(CLAIMS, now)
    # Nearly always there is nothing to take back: found out without joining the sessions (the sweep
    # runs every second in every server).
    if not dead.exists():
        return 0, 0, 0
    resent = unconfirmed = 0
    echoing = platforms_that_echo()
    if echoing:
        # It may have been handed over before its claimer died: an echo that still comes for it counts
        # (chat.ingest takes echoes only for messages handed over). When it was last handed over is
        # unknown: when that was noticed.
        handed = {**CLAIMS.released(), "sent_at": Coalesce(F("sent_at"), Value(now)), "next_attempt_at": None}
        resent, unconfirmed = claims.retry_or_fail(
            dead.filter(session__platform__in=echoing),
            attempts=CLAIMS.attempts,
            most=get_config().gateway.max_delivery_attempts,
            retry={**handed, "delivery_status": DeliveryStatus.PENDING},
            fail={**handed, "delivery_status": DeliveryStatus.UNCONFIRMED, "delivery_error": DeliveryError.NO_ECHO},
        )
        dead = dead.exclude(session__platform__in=echoing)
    interrupted = claims.end(
        CLAIMS,
        dead,
        delivery_status=DeliveryStatus.FAILED,
        delivery_error=DeliveryError.INTERRUPTED,
        next_attempt_at=None,
    )
    return resent, unconfirmed, interrupted


class OutboxDue(NamedTuple):
    """The next instants the outbox has work, as far as the rows say (None: nothing known)."""

    round: datetime | None  # a row's redelivery backoff or confirm deadline ends (next_attempt_at)
    sweep: datetime | None  # a claim's lease, a pending row's offline expiry, an orphaned echo's grace


# The sweep's conditions are strict (`lease < now`): it looks just past the instant, not at it.
JUST_PAST = timedelta(milliseconds=1)


def _earliest(rows, field: str) -> datetime | None:
    return rows.order_by(field).values_list(field, flat=True).first()


def outbox_next_due(*, swept_at: datetime, now: datetime | None = None) -> OutboxDue:
    """When the deliverer must look again without a wake-up: its sleep ends then, not at a poll. A round
    instant only after `now` (earlier ones were this round's, or are another process's); a sweep instant
    only after `swept_at`, the last sweep's start (earlier ones it has settled, or cannot), except a
    pending row's offline expiry: a sweep fails every pending row past it that it sees, so one still
    pending was not there for it (claimed then and given back since, or committed after it began) and is
    due now. A few indexed queries that read nothing while the outbox is empty."""
    now = now or timezone.now()
    config = get_config().gateway
    lease = timedelta(seconds=config.delivery_lease_seconds)
    next_attempt = _earliest(Message.objects.filter(next_attempt_at__gt=now), "next_attempt_at")
    sweep = []
    echoes = Message.objects.filter(delivery_status=DeliveryStatus.SENT, next_attempt_at__gt=swept_at - lease)
    if (orphan := _earliest(echoes, "next_attempt_at")) is not None:
        sweep.append(orphan + lease)
    if (claimed := _earliest(Message.objects.filter(delivery_status=DeliveryStatus.SENDING), CLAIMS.lease)) is not None:
        sweep.append(claimed + JUST_PAST)
    oldest = (
        Message.objects.filter(delivery_status=DeliveryStatus.PENDING, direction=Direction.OUT)
        .order_by("id")
        .values_list("created_at", flat=True)
        .first()
    )
    later = [t for t in sweep if t > swept_at]
    if oldest is not None:
        later.append(oldest + timedelta(seconds=config.offline_expiry_seconds) + JUST_PAST)
    return OutboxDue(round=next_attempt, sweep=min(later) if later else None)
