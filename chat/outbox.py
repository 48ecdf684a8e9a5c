"""The outbox: claiming pending outbound Message rows, handing their frames to the connected adapter (or
browser) of their platform, and marking the outcome. Frames are built by chat.wire.outbound.

Rows are claimed with a conditional UPDATE (pending → sending, with a claim token, the claiming
process's instance and a lease of `gateway.delivery_lease_seconds`), so several ASGI processes never
send one row twice; each process claims only rows it can deliver (the platforms, and the browser users,
connected to it). A row is marked sent once its frame has been handed to the socket, delivered when the
adapter's `message_id_echo` names it (chat.ingest). Rows waiting for an offline adapter longer than
`gateway.offline_expiry_seconds` fail with `adapter_offline`.

A claim ends with its claimer: every server's sweep takes back the `sending` rows of a process whose
heartbeat has run out (core.process.Heartbeat: seconds after it died), in the one UPDATE that decides,
so two servers never both take a row; the lease is only the backstop for a live claimer that never
finishes. A claimer hands a claimed row to a socket only while its heartbeat vouches for the claim (a
server paused past its heartbeat, then resumed, hands over nothing it may have lost meanwhile), and
every mark it makes afterwards is conditional on still holding the claim token.

Two delivery guarantees, by what the platform's adapter has shown (AdapterPlatform.first_echo_at):
- A platform whose adapter has never echoed: at most once. A row whose claimer died mid-send (or ran
  out its lease) fails with `delivery_interrupted` rather than risk a second copy on the platform.
- A platform whose adapter echoes: a sent row carries its confirm deadline in `next_attempt_at`
  (`gateway.confirm_seconds`, doubling with each attempt); with no echo by then it is pending again and
  handed over again, oldest first, `gateway.max_delivery_attempts` hand-overs in all, then
  `unconfirmed` (`no_echo`). A row left `sending` by a dead claimer is treated the same way. The price:
  a platform that delivered but whose echo was lost gets the message again (never more often than the
  attempt limit). Which rows go to a connection that has not echoed yet (the gate) is the Sink's
  choice: chat.gateway.registry.

Wake-ups: the send service's `outbound_created` signal wakes this process's deliverer at once, and the
other processes' through the notifier (chat.notify: the channel layer, or the local wake sockets).
Either way the deliverer also polls (`gateway.outbox_poll_seconds`, `outbox_poll_seconds_with_redis`):
a lost wake-up costs one poll, never a message.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection
from django.db.models import Case, DateTimeField, F, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from chat import events
from chat.delivery_errors import DeliveryError
from chat.models import AdapterConnection, AdapterPlatform, ChatSession, DeliveryStatus, Direction, Message
from chat.notify import get_notifier
from chat.wire.outbound import adapter_envelope, browser_frame
from core.aio import wait_event
from core.config import get_config
from core.process import Heartbeat, dead_claimers, heartbeat_acquire, heartbeat_release, instance_id

logger = logging.getLogger(__name__)

WEB_PLATFORM = "web"
# Rows per claim: the size of one claim's statements, tuned with bench/ingest.py, not an operator's
# choice (a round that fills it claims again at once).
BATCH_SIZE = 500
# The session columns adapter_envelope and browser_frame read.
FRAME_SESSION_FIELDS = (
    "session_id", "platform", "chat_type", "user_id", "user_nickname", "user_cardname", "group_id", "group_name",
)  # fmt: skip


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


class Overdue(NamedTuple):
    """A sent row whose echo did not come in time, as outbox_confirm_overdue left it."""

    id: int
    platform: str
    sent_at: datetime | None
    # True: pending again (it will be handed over again); False: unconfirmed (attempts used up).
    again: bool


def confirm_deadline(*, attempts: int, now: datetime) -> datetime:
    """When a row handed over for the `attempts`-th time is handed over again unless its echo came."""
    config = get_config().gateway
    exponent = max(0, min(attempts, config.max_delivery_attempts) - 1)
    return now + timedelta(seconds=config.confirm_seconds * 2**exponent)


# --- the outbox service (sync; the deliverer calls it with sync_to_async) -------------------------


def outbox_claim(
    *,
    adapter_platforms: Collection[str],
    web_users: Collection[str],
    accept_formats: dict[str, list[str]],
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
    if lease_seconds is None:
        lease_seconds = config.delivery_lease_seconds
    now = now or timezone.now()
    token = uuid.uuid4().hex
    # Rows past the offline expiry are never sent, even before the sweep has marked them failed; rows
    # waiting out a redelivery backoff are not due yet.
    cutoff = now - timedelta(seconds=config.offline_expiry_seconds)
    due = Message.objects.filter(
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
        delivery_status=DeliveryStatus.PENDING,
        created_at__gte=cutoff,
    ).order_by("id")
    ids: list[int] = []
    platforms = [p for p in adapter_platforms if p != WEB_PLATFORM]
    if platforms or web_users:
        target = Q(session__platform__in=platforms)
        if web_users:
            target |= Q(session__platform=WEB_PLATFORM, session__user_id__in=list(web_users))
        ids = list(due.filter(target).values_list("id", flat=True)[:limit])
    for platform in probing:
        first = due.filter(session__platform=platform).values_list("id", flat=True).first()
        if first is not None:
            ids.append(first)
    if not ids:
        return token, []
    Message.objects.filter(id__in=ids, delivery_status=DeliveryStatus.PENDING).update(
        delivery_status=DeliveryStatus.SENDING,
        delivery_claim=token,
        delivery_claimed_by=claimer or instance_id(),
        delivery_lease_until=now + timedelta(seconds=lease_seconds),
        delivery_attempts=F("delivery_attempts") + 1,
    )
    # Plain tuples, not model instances: building two instances per row was most of a claim's cost.
    rows = [
        OutboundRow(*values)
        for values in Message.objects.filter(delivery_claim=token, delivery_status=DeliveryStatus.SENDING)
        .order_by("id")
        .values_list(*OutboundRow._fields)
    ]
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
    return token, deliveries


def outbox_finish(
    *,
    token: str,
    sent: Collection[int],
    released: Collection[int],
    failed: dict[int, DeliveryError],
    awaiting_echo: Collection[int] = (),
    now: datetime | None = None,
) -> None:
    """Record a claimed batch's outcome: sent rows get sent_at (those in `awaiting_echo`, of platforms
    that echo, also their confirm deadline), released rows wait again."""
    now = now or timezone.now()
    held = Message.objects.filter(delivery_claim=token, delivery_status=DeliveryStatus.SENDING)
    confirmed = set(awaiting_echo) & set(sent)
    plain = [i for i in sent if i not in confirmed]
    if plain:
        held.filter(id__in=plain).update(
            delivery_status=DeliveryStatus.SENT,
            sent_at=now,
            delivery_claim="",
            delivery_lease_until=None,
            next_attempt_at=None,
        )
    if confirmed:
        most = get_config().gateway.max_delivery_attempts
        deadline = Case(
            *[When(delivery_attempts=n, then=Value(confirm_deadline(attempts=n, now=now))) for n in range(1, most)],
            default=Value(confirm_deadline(attempts=most, now=now)),
            output_field=DateTimeField(),
        )
        held.filter(id__in=list(confirmed)).update(
            delivery_status=DeliveryStatus.SENT,
            sent_at=now,
            delivery_claim="",
            delivery_lease_until=None,
            next_attempt_at=deadline,
        )
    if released:
        # Claimed but not handed over: the claim's attempt did not happen.
        held.filter(id__in=list(released)).update(
            delivery_status=DeliveryStatus.PENDING,
            delivery_claim="",
            delivery_lease_until=None,
            delivery_attempts=F("delivery_attempts") - 1,
        )
    for message_id, error in failed.items():
        held.filter(id=message_id).update(
            delivery_status=DeliveryStatus.FAILED,
            delivery_error=error,
            delivery_claim="",
            delivery_lease_until=None,
            next_attempt_at=None,
        )
        logger.warning("outbound message %s failed: %s", message_id, error)


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
    again = [row[0] for row in found if row[3] < most]
    spent = [row[0] for row in found if row[3] >= most]
    still = Message.objects.filter(delivery_status=DeliveryStatus.SENT, next_attempt_at__lte=now)
    if again:
        still.filter(id__in=again).update(delivery_status=DeliveryStatus.PENDING)
    if spent:
        still.filter(id__in=spent).update(
            delivery_status=DeliveryStatus.UNCONFIRMED, delivery_error=DeliveryError.NO_ECHO, next_attempt_at=None
        )
        logger.warning(
            "%d outbound messages unconfirmed: no echo after %d hand-overs (%s)", len(spent), most, spent[:20]
        )
    if again:
        logger.info("%d outbound messages not confirmed in time; handing them over again", len(again))
    return [Overdue(id=i, platform=p, sent_at=t, again=n < most) for i, p, t, n in found]


def outbox_platform_reconnected(*, platform: str, now: datetime | None = None) -> int:
    """A new connection of an echoing platform: rows handed to an earlier one and still awaiting their
    echo are due at once (that connection is gone, their echo most likely with it), so they go out
    again first, in order, rather than after the backlog."""
    now = now or timezone.now()
    return Message.objects.filter(
        session__platform=platform, delivery_status=DeliveryStatus.SENT, next_attempt_at__gt=now
    ).update(next_attempt_at=now)


def outbox_sweep(*, now=None) -> tuple[int, int]:
    """Fail rows that waited past the offline expiry. Take back the claims of dead claimers (heartbeat
    run out) and of claims past their lease: such a row fails too, or, on a platform that echoes,
    counts as sent without an echo (handed over again within the attempt limit). Each is one UPDATE
    whose condition names the dead claimers, so servers sweeping at once never take a row twice, and a
    live claimer's rows (however long it has held them, within the lease) are never touched.
    Rows whose echo is overdue on a platform with no open adapter connection are settled here too, one
    lease after their deadline (a process holding the platform's connection settles them at once)."""
    now = now or timezone.now()
    config = get_config().gateway
    cutoff = now - timedelta(seconds=config.offline_expiry_seconds)
    expired = Message.objects.filter(
        direction=Direction.OUT, delivery_status=DeliveryStatus.PENDING, created_at__lt=cutoff
    ).update(delivery_status=DeliveryStatus.FAILED, delivery_error=DeliveryError.ADAPTER_OFFLINE, next_attempt_at=None)
    dead = Message.objects.filter(delivery_status=DeliveryStatus.SENDING).filter(
        Q(delivery_lease_until__lt=now) | Q(delivery_claimed_by__in=dead_claimers())
    )
    resent = unconfirmed = interrupted = 0
    # Nearly always there is nothing to take back: found out without joining the sessions (the sweep
    # runs every second in every server).
    if dead.exists():
        echoing = list(AdapterPlatform.objects.filter(first_echo_at__isnull=False).values_list("platform", flat=True))
        if echoing:
            mine = dead.filter(session__platform__in=echoing)
            unconfirmed = mine.filter(delivery_attempts__gte=config.max_delivery_attempts).update(
                delivery_status=DeliveryStatus.UNCONFIRMED,
                delivery_error=DeliveryError.NO_ECHO,
                # When it was last handed over is unknown (its claimer died): when that was noticed.
                sent_at=Coalesce(F("sent_at"), Value(now)),
                delivery_claim="",
                delivery_lease_until=None,
                next_attempt_at=None,
            )
            resent = mine.update(
                delivery_status=DeliveryStatus.PENDING,
                # It may have been handed over before its claimer died: an echo that still comes for it
                # counts (chat.ingest takes echoes only for messages handed over).
                sent_at=Coalesce(F("sent_at"), Value(now)),
                delivery_claim="",
                delivery_lease_until=None,
                next_attempt_at=None,
            )
            dead = dead.exclude(session__platform__in=echoing)
        interrupted = dead.update(
            delivery_status=DeliveryStatus.FAILED,
            delivery_error=DeliveryError.INTERRUPTED,
            delivery_claim="",
            delivery_lease_until=None,
            next_attempt_at=None,
        )
    grace = now - timedelta(seconds=config.delivery_lease_seconds)
    overdue = Message.objects.filter(delivery_status=DeliveryStatus.SENT, next_attempt_at__lte=grace)
    if overdue.exists():
        connected = AdapterConnection.objects.filter(disconnected_at__isnull=True).values_list("platform", flat=True)
        orphans = overdue.exclude(session__platform__in=list(connected))
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


# --- the deliverer (async, in the ASGI process) ---------------------------------------------------


class Sink:
    """Where a claimed row goes: the registry of live connections in this process (chat.gateway)."""

    def adapter_platforms(self) -> Collection[str]:
        """Connected platforms that take whatever is due."""
        ...

    def probing_platforms(self) -> Collection[str]:
        """Connected platforms that take one row now (a connection that has not shown it can deliver)."""
        ...

    def echoing_platforms(self) -> Collection[str]:
        """Connected platforms whose adapter echoes: their rows await an echo once sent."""
        ...

    def web_users(self) -> Collection[str]: ...
    def accept_formats(self) -> dict[str, list[str]]: ...
    async def deliver(self, delivery: Delivery) -> bool:
        """Write the frame; False when the connection is gone (the row waits again)."""
        ...

    def confirm_missed(self, overdue: list[Overdue]) -> None:
        """Rows of this process's platforms whose echo did not come in time."""


def db_call(executor: ThreadPoolExecutor, fn: Callable) -> Callable:
    """`fn` (sync, ORM) as an awaitable that runs in `executor`: one long-lived thread, one connection."""

    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DatabaseError:
            # A broken connection in this long-lived thread must not poison every later call.
            connection.close()
            raise

    return sync_to_async(run, thread_sensitive=False, executor=executor)


class Deliverer:
    """One task per ASGI process: claims deliverable rows and writes them, in order, to the sockets."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # One thread keeps one database connection for the deliverer's short statements.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox")
        self._claim = db_call(self.executor, outbox_claim)
        self._finish = db_call(self.executor, outbox_finish)
        self._sweep = db_call(self.executor, outbox_sweep)
        self._overdue = db_call(self.executor, outbox_confirm_overdue)
        self.sent_total = 0
        self.rounds = 0  # claim rounds run (tests wait for rounds to prove that nothing was handed over)
        # The loop time of the earliest confirm deadline of a row this process handed over: the
        # deliverer looks again then, not only at its next poll.
        self._next_deadline = float("inf")
        # This process's heartbeat, which vouches for its claims (held while run() runs).
        self.heartbeat: Heartbeat | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the deliverer runs on (None before it starts)."""
        return self._loop

    def wake(self) -> None:
        """Thread-safe: deliver now rather than at the next poll."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._event.set()
        else:
            loop.call_soon_threadsafe(self._event.set)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        # Beating before the first claim: a claim is only as good as the heartbeat that vouches for it.
        acquiring = asyncio.ensure_future(asyncio.to_thread(heartbeat_acquire, "web"))
        try:
            self.heartbeat = await asyncio.shield(acquiring)
            await self._rounds()
        finally:
            self.heartbeat = None
            # Released once acquired, also when the deliverer is stopped during the first beat.
            await asyncio.shield(self._release_heartbeat(acquiring))

    @staticmethod
    async def _release_heartbeat(acquiring: asyncio.Future) -> None:
        try:
            await acquiring
        except Exception:
            return  # never acquired
        await asyncio.to_thread(heartbeat_release)

    async def _rounds(self) -> None:
        last_sweep = float("-inf")
        while True:
            config = get_config().gateway  # read each round: a reload applies without a restart
            poll = get_notifier().outbox_poll_seconds(config)
            now = self._loop.time()
            # The sweep keeps its own pace (it takes back the claims of dead servers), even while the
            # poll is long (with Redis).
            wait = min(poll, self._next_deadline - now, last_sweep + config.outbox_sweep_seconds - now)
            await wait_event(self._event, max(0.0, wait))
            self._event.clear()
            try:
                if self._loop.time() - last_sweep >= config.outbox_sweep_seconds:
                    last_sweep = self._loop.time()
                    await self._sweep()
                while await self._round():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("outbox round failed; retrying shortly")
                await asyncio.sleep(1)

    async def _round(self) -> bool:
        self.rounds += 1
        echoing = set(self.sink.echoing_platforms())
        if self._loop.time() >= self._next_deadline:
            self._next_deadline = float("inf")
        if echoing:
            # Rows past their confirm deadline go back (or are unconfirmed) before anything is claimed:
            # one indexed query, only while a platform that echoes is connected here.
            overdue = await self._overdue(platforms=echoing)
            if overdue:
                self.sink.confirm_missed(overdue)
        platforms = list(self.sink.adapter_platforms())
        probing = list(self.sink.probing_platforms())
        users = list(self.sink.web_users())
        if not platforms and not users and not probing:
            return False
        epoch = self.heartbeat.vouch() if self.heartbeat is not None else None
        if epoch is None:
            return False  # no claim this process cannot vouch for (the heartbeat logs why it lapsed)
        token, batch = await self._claim(
            adapter_platforms=platforms,
            web_users=users,
            probing=probing,
            accept_formats=dict(self.sink.accept_formats()),
        )
        if not batch:
            return False
        sent: list[int] = []
        released: list[int] = []
        failed: dict[int, DeliveryError] = {}
        gone: set[tuple[str, str]] = set()
        lapsed = False
        # The hand-over time recorded (sent_at, and the confirm deadline counted from it): taken before
        # the first frame is written, so no echo of this batch can carry an earlier time.
        handed_at = timezone.now()
        try:
            for delivery in batch:
                key = (delivery.platform, delivery.user_id if delivery.platform == WEB_PLATFORM else "")
                if lapsed or not self.heartbeat.vouches(epoch):
                    # The claim may have been taken back meanwhile (this process was paused, or its
                    # heartbeat failed, past the point where the others count it dead): hand over
                    # nothing more of it. The release is conditional on the claim, like every mark.
                    lapsed = True
                    released.append(delivery.message_id)
                elif delivery.error:
                    failed[delivery.message_id] = delivery.error
                elif key in gone:
                    # Keep per-session order: once a connection fails, the rest of its rows wait.
                    released.append(delivery.message_id)
                elif await self.sink.deliver(delivery):
                    sent.append(delivery.message_id)
                else:
                    gone.add(key)
                    released.append(delivery.message_id)
        finally:
            done = set(sent) | set(released) | set(failed)
            released.extend(d.message_id for d in batch if d.message_id not in done)
            handed = set(sent)
            awaiting = [d for d in batch if d.platform in echoing and d.message_id in handed]
            await asyncio.shield(
                self._finish(
                    token=token,
                    sent=sent,
                    released=released,
                    failed=failed,
                    awaiting_echo=[d.message_id for d in awaiting],
                    now=handed_at,
                )
            )
        if awaiting:
            window = get_config().gateway.confirm_seconds
            first = min(window * 2 ** max(0, d.attempts - 1) for d in awaiting)
            self._next_deadline = min(self._next_deadline, self._loop.time() + first)
        if lapsed:
            logger.warning(
                "outbox: this server's heartbeat no longer vouched for its claim; %d claimed messages not "
                "handed over (they go to whoever holds them now, or wait for a later round)",
                len(released),
            )
        self.sent_total += len(sent)
        if sent:
            events.emit_background(events.Point.AFTER_SEND, lambda: _after_send_kwargs(sent))
        return len(batch) >= BATCH_SIZE and not gone and not lapsed


def _after_send_kwargs(message_ids: list[int]) -> list[dict[str, Any]]:
    """The `send_service.after_send` kwargs of messages just handed over (read in the emitter's thread)."""
    rows = Message.objects.select_related("session").filter(pk__in=message_ids).order_by("id")
    return [{"message": m, "session": m.session} for m in rows]
