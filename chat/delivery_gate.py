"""The delivery gate: how far an adapter connection is trusted with outbound rows, and when a row handed
over without an echo goes again.

What a platform's adapter has shown has one source of truth, its AdapterPlatform row: `first_echo_at`
(it echoes; set by chat.ingest when it stores the platform's first `message_id_echo`) or `no_echo_at`
(a connection that stayed up showed it never echoes; set here). Neither: the platform is unproven.
`platforms_that_echo` reads it for the sweep, and a `DeliveryGate` keeps, for the platforms connected
to its process, the same facts as it read them when the connection opened (`connected`), updated by
what happens over the process's own connections.

For a platform that echoes:
- Probation. A new connection is unproven: it takes one row at a time (the oldest due, `probing`)
  until an echo arrives over it; then the backlog flows (`open`). A row handed to a proven connection
  that misses its confirm deadline makes it unproven again. So after an adapter restart, or while its
  platform side (NapCat) is down or the adapter is frozen, what is handed over and lost is one row,
  redelivered, not the backlog. This state is per connection, in memory (on the Connection): the
  process holding the connection claims for it and receives its echoes.
- Confirm deadlines. A sent row waits for its echo until `confirm_deadline` (`gateway.confirm_seconds`,
  doubling with each hand-over, core.retry.backoff); with none by then it is pending again, or
  `unconfirmed` (`no_echo`) after `gateway.max_delivery_attempts` hand-overs (`outbox_confirm_overdue`).
  A new connection makes the rows awaiting an echo from an earlier one due at once
  (`outbox_platform_reconnected`).

For an unproven platform (a fresh install): its connections are on probation too, one row at a time,
each with its confirm deadline, until either
- an echo arrives: the platform echoes (above), and the backlog flows; or
- the probe's deadline passes on the connection it went to, still up: the adapter delivers without
  echoing (`outbox_unanswered_probes`). The platform is remembered as one that never echoes: its rows
  flow at once and at most once from then on (the probe stays `sent`, never handed over twice). That
  first message costs the platform one confirm window, once.
- An outage before either (the connection goes while its probe awaits an echo) keeps the rest queued.
  The probe's fate is unknown and it is not sent twice (`outbox_unproven_reconnected`). The next
  connection is `wary`: an adapter reconnects before its own platform side (NapCat comes back 1.4-2.1 s
  after a restarted adapter, which drops what it is handed meanwhile), so its first unanswered probe
  is handed over again rather than taken as the verdict; the next unanswered one is the verdict.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from django.db import transaction
from django.db.models import Case, DateTimeField, Value, When
from django.utils import timezone

from chat.claims import retry_or_fail
from chat.delivery_errors import DeliveryError
from chat.models import AdapterPlatform, DeliveryStatus, Message
from core.config import get_config
from core.retry import backoff

logger = logging.getLogger(__name__)


class Overdue(NamedTuple):
    """A sent row whose echo did not come in time, as outbox_confirm_overdue left it."""

    id: int
    platform: str
    sent_at: datetime | None
    # True: pending again (it will be handed over again); False: unconfirmed (attempts used up).
    again: bool


def confirm_window(attempts: int) -> float:
    """Seconds a row handed over for the `attempts`-th time waits for its echo."""
    config = get_config().gateway
    return backoff(config.confirm_seconds, min(attempts, config.max_delivery_attempts))


def confirm_deadline(*, attempts: int, now: datetime) -> datetime:
    """When a row handed over for the `attempts`-th time is handed over again unless its echo came."""
    return now + timedelta(seconds=confirm_window(attempts))


def confirm_deadlines(now: datetime) -> Case:
    """Each row's confirm deadline for a hand-over at `now`, by its delivery_attempts (for an UPDATE)."""
    most = get_config().gateway.max_delivery_attempts
    return Case(
        *[When(delivery_attempts=n, then=Value(confirm_deadline(attempts=n, now=now))) for n in range(1, most)],
        default=Value(confirm_deadline(attempts=most, now=now)),
        output_field=DateTimeField(),
    )


def platforms_that_echo() -> list[str]:
    """The platforms whose adapter has echoed (the durable truth)."""
    return list(AdapterPlatform.objects.filter(first_echo_at__isnull=False).values_list("platform", flat=True))


def outbox_confirm_overdue(*, platforms: Collection[str] | None, now: datetime | None = None) -> list[Overdue]:
    """Sent rows whose confirm deadline passed with no echo: pending again (due at once), or
    `unconfirmed` (no_echo) once they were handed over gateway.max_delivery_attempts times.

    `platforms`: only rows of these (the ones whose connections this process holds, so that it learns
    which of its connections missed a deadline); None for every platform. Each row moves with a
    conditional UPDATE, so processes doing this at once never move a row twice.
    """
    now = now or timezone.now()
    rows = Message.objects.filter(delivery_status=DeliveryStatus.SENT, next_attempt_at__lte=now)
    if platforms is not None:
        if not platforms:
            return []
        rows = rows.filter(session__platform__in=list(platforms))
    found = list(rows.order_by("id").values_list("id", "session__platform", "sent_at", "delivery_attempts"))
    if not found:
        return []
    most = get_config().gateway.max_delivery_attempts
    retry_or_fail(
        Message.objects.filter(
            delivery_status=DeliveryStatus.SENT, next_attempt_at__lte=now, id__in=[row[0] for row in found]
        ),
        attempts="delivery_attempts",
        most=most,
        retry={"delivery_status": DeliveryStatus.PENDING},
        fail={
            "delivery_status": DeliveryStatus.UNCONFIRMED,
            "delivery_error": DeliveryError.NO_ECHO,
            "next_attempt_at": None,
        },
    )
    spent = [row[0] for row in found if row[3] >= most]
    if spent:
        logger.warning(
            "%d outbound messages unconfirmed: no echo after %d hand-overs (%s)", len(spent), most, spent[:20]
        )
    if len(spent) < len(found):
        logger.info("%d outbound messages not confirmed in time; handing them over again", len(found) - len(spent))
    return [Overdue(id=i, platform=p, sent_at=t, again=n < most) for i, p, t, n in found]


def outbox_platform_reconnected(*, platform: str, now: datetime | None = None) -> int:
    """A new connection of an echoing platform: rows handed to an earlier one and still awaiting their
    echo are due at once (that connection is gone, their echo most likely with it), so they go out
    again first, in order, rather than after the backlog."""
    now = now or timezone.now()
    return Message.objects.filter(
        session__platform=platform, delivery_status=DeliveryStatus.SENT, next_attempt_at__gt=now
    ).update(next_attempt_at=now)


def outbox_unproven_reconnected(*, platform: str) -> int:
    """A new connection of an unproven platform: rows handed to an earlier one and still awaiting their
    echo (its probe) lost that echo with it. Whether they reached the platform is unknown, and the
    platform is not known to echo: they stay `sent` and await nothing more (never handed over twice).
    Their number: more than none means an outage came before the platform showed what it does."""
    return Message.objects.filter(
        session__platform=platform, delivery_status=DeliveryStatus.SENT, next_attempt_at__isnull=False
    ).update(next_attempt_at=None)


def outbox_unanswered_probes(*, platforms: Collection[str], now: datetime | None = None) -> list[str]:
    """Of these unproven platforms (each on a live connection of the calling process, which handed their
    rows over), those whose probe's confirm deadline passed with no echo: their adapter does not echo.
    Their overdue rows stay `sent` (at most once, as on any platform that does not echo) and the
    platforms are remembered (`no_echo_at`). A platform whose echo came meanwhile is left out."""
    now = now or timezone.now()
    if not platforms:
        return []
    overdue = Message.objects.filter(delivery_status=DeliveryStatus.SENT, next_attempt_at__lte=now)
    with transaction.atomic():
        found = set(overdue.filter(session__platform__in=list(platforms)).values_list("session__platform", flat=True))
        found -= set(
            AdapterPlatform.objects.filter(platform__in=found, first_echo_at__isnull=False).values_list(
                "platform", flat=True
            )
        )
        if not found:
            return []
        overdue.filter(session__platform__in=list(found)).update(next_attempt_at=None)
        for platform in sorted(found):
            if not AdapterPlatform.objects.filter(platform=platform).update(no_echo_at=now, updated_at=now):
                AdapterPlatform.objects.get_or_create(platform=platform, defaults={"no_echo_at": now})
    for platform in sorted(found):
        logger.warning(
            "platform %s: no echo within the confirm window on a connection that stayed up: its adapter does "
            "not confirm deliveries; its messages go out at once and at most once from now on",
            platform,
        )
    return sorted(found)


class GatedConnection(Protocol):
    """What the gate reads and keeps on an adapter connection (chat.gateway.connections.Connection)."""

    platform: str
    ready: bool  # recorded, and its platform's echo history read: until then it is handed nothing
    opened_at: datetime | None
    proven: bool  # an echo came over it since it opened (or since it last missed a confirm deadline)
    probe_id: int | None  # the one row handed to it while unproven
    # Of an unproven platform, opened after an outage came before the verdict: its first unanswered
    # probe is handed over again rather than taken to show that the platform never echoes.
    wary: bool


class DeliveryGate:
    """The gate of one process's adapter connections (`adapters`: the registry's live dict, by
    platform): which platforms take what is due, which take one row, which rows await an echo."""

    def __init__(self, adapters: dict[str, Any]) -> None:
        self.adapters = adapters
        # Connected platforms whose adapter echoes, and those whose adapter never does: their
        # AdapterPlatform row as read at connect, and what was seen here since. In neither: unproven.
        self.echoing: set[str] = set()
        self.silent: set[str] = set()

    def connected(
        self, conn: GatedConnection, *, echoes: bool, never_echoes: bool = False, after_outage: bool = False
    ) -> None:
        """`conn` is recorded; `echoes` / `never_echoes`: what its platform's row says (an operator may
        reset it); `after_outage`: an unproven platform's earlier connection went with its probe out."""
        self.echoing.discard(conn.platform)
        self.silent.discard(conn.platform)
        if echoes:
            self.echoing.add(conn.platform)
        elif never_echoes:
            self.silent.add(conn.platform)
        conn.wary = after_outage and self._unproven(conn.platform)
        conn.ready = True
        if self._unproven(conn.platform):
            logger.info(
                "adapter %r connected; its platform has not shown whether it confirms deliveries: one message at a"
                " time until an echo comes, or a confirm window passes without one%s",
                conn,
                " (twice: it reconnected before showing it)" if conn.wary else "",
            )
        elif self._gated(conn):
            logger.info("adapter %r connected: one message at a time until it echoes a delivery", conn)
        else:
            logger.info("adapter %r connected", conn)

    def echo_seen(self, conn: GatedConnection, content: Any) -> bool:
        """An echo came over `conn`: its platform side delivers, so its backlog may flow. True when
        the deliverer should look again (`conn` is its platform's live connection, newly proven)."""
        if not isinstance(content, dict) or content.get("actual_id") in (None, "") or conn.proven:
            return False
        self.echoing.add(conn.platform)
        self.silent.discard(conn.platform)
        conn.proven, conn.probe_id, conn.wary = True, None, False
        if self.adapters.get(conn.platform) is not conn:
            return False
        logger.info("adapter %r echoed a delivery: its backlog goes out", conn)
        return True

    def never_echoes(self, platforms: Collection[str]) -> None:
        """These unproven platforms showed that their adapter never echoes (outbox_unanswered_probes):
        their connections take whatever is due from now on (an echo seen here meanwhile wins)."""
        for platform in platforms:
            if platform in self.echoing:
                continue
            self.silent.add(platform)
            conn = self.adapters.get(platform)
            if conn is not None:
                conn.probe_id, conn.wary = None, False

    def _unproven(self, platform: str) -> bool:
        return platform not in self.echoing and platform not in self.silent

    def _gated(self, conn: GatedConnection) -> bool:
        return conn.platform not in self.silent and not conn.proven

    def adapter_platforms(self) -> Collection[str]:
        """Connected platforms that take whatever is due."""
        return [p for p, conn in self.adapters.items() if conn.ready and not self._gated(conn)]

    def probing_platforms(self) -> Collection[str]:
        """Connected platforms that take one row now (a connection that has not shown it can deliver)."""
        return [p for p, conn in self.adapters.items() if conn.ready and self._gated(conn) and conn.probe_id is None]

    def confirming_platforms(self) -> Collection[str]:
        """Connected platforms whose hand-overs await an echo (the platform echoes, or has not shown
        that it never does)."""
        return [p for p in self.adapters if p not in self.silent]

    def overdue_platforms(self) -> Collection[str]:
        """Connected platforms whose rows may be past their confirm deadline: those that echo, and the
        unproven ones with a probe out (their only row awaiting an echo)."""
        return [
            p
            for p, conn in self.adapters.items()
            if p in self.echoing or (self._unproven(p) and conn.probe_id is not None)
        ]

    def concluding_platforms(self) -> Collection[str]:
        """Connected unproven platforms whose probe, unanswered by its deadline, shows that they never
        echo (outbox_unanswered_probes); the other confirming platforms' rows go again instead."""
        return [
            p
            for p, conn in self.adapters.items()
            if conn.ready and self._unproven(p) and not conn.wary and conn.probe_id is not None
        ]

    def take(self, conn: GatedConnection, message_id: int) -> bool:
        """Whether `conn` may be handed the row now (an unproven one: as its probe, if none is out)."""
        if not self._gated(conn):
            return True
        if conn.probe_id is not None:
            return False  # a probe is out already: this row waits (claimed before the gate closed)
        conn.probe_id = message_id
        return True

    def not_written(self, conn: GatedConnection, message_id: int) -> None:
        """The row taken for `conn` was not written: it waits again, and is no probe in flight."""
        if conn.probe_id == message_id:
            conn.probe_id = None

    def confirm_missed(self, overdue: list[Overdue]) -> None:
        """Rows of this process's platforms whose echo did not come in time."""
        for row in overdue:
            conn = self.adapters.get(row.platform)
            if conn is None:
                continue
            if conn.probe_id == row.id:
                conn.probe_id = None  # the next oldest due (most likely this row again) is the next probe
                if conn.wary:
                    conn.wary = False  # handed over again once; the next unanswered probe is the verdict
                    logger.info("adapter %r: no echo for message %s yet; handing it over again", conn, row.id)
            elif conn.proven and row.sent_at is not None and conn.opened_at and row.sent_at >= conn.opened_at:
                conn.proven, conn.probe_id = False, None
                logger.warning(
                    "adapter %r did not confirm message %s in time: one message at a time until it echoes again",
                    conn,
                    row.id,
                )
