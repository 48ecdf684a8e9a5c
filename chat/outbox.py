"""The outbox: claiming pending outbound Message rows, handing their frames to the connected adapter (or
browser) of their platform, and marking the outcome. Frames are built by chat.wire.outbound.

Rows are claimed with a conditional UPDATE (pending → sending, with a claim token and a lease of
`gateway.delivery_lease_seconds`), so several ASGI processes never send one row twice; each process
claims only rows it can deliver (the platforms, and the browser users, connected to it). A row is
marked sent once its frame has been handed to the socket. Delivery is at most once: a row whose
claimer died mid-send (lease run out) fails with `delivery_interrupted` rather than risk a second copy
on the platform. Rows waiting for an offline adapter longer than `gateway.offline_expiry_seconds` fail
with `adapter_offline`.

Wake-ups: the send service's `outbound_created` signal wakes this process's deliverer at once; with
REDIS_URL it also reaches every ASGI process through the channel layer group `maibot.outbox` (published
from a loop of its own, see OutboxWakePublisher); without Redis the deliverer polls every
`gateway.outbox_poll_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import F, Q
from django.dispatch import receiver
from django.utils import timezone

from chat.delivery_errors import DeliveryError
from chat.models import ChatSession, DeliveryStatus, Direction, Message
from chat.services import outbound_created
from chat.wire.outbound import adapter_envelope, browser_frame
from maibot.config import get_config

logger = logging.getLogger(__name__)

WEB_PLATFORM = "web"
OUTBOX_GROUP = "maibot.outbox"
# Rows per claim: the size of one claim's statements, tuned with bench/ingest.py, not an operator's
# choice (a round that fills it claims again at once).
BATCH_SIZE = 500


@dataclass
class Delivery:
    """One claimed row, with the frame to write and where to write it."""

    message_id: int
    platform: str
    session_id: str
    user_id: str  # the browser user for platform `web`
    frame: dict[str, Any] | None
    error: DeliveryError | None = None


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


# --- the outbox service (sync; the deliverer calls it with sync_to_async) -------------------------


def outbox_claim(
    *,
    adapter_platforms: Collection[str],
    web_users: Collection[str],
    accept_formats: dict[str, list[str]],
    limit: int = BATCH_SIZE,
    lease_seconds: float | None = None,
) -> tuple[str, list[Delivery]]:
    """Claim up to `limit` pending rows this process can deliver, oldest first, with their frames."""
    config = get_config().gateway
    if lease_seconds is None:
        lease_seconds = config.delivery_lease_seconds
    token = uuid.uuid4().hex
    target = Q(session__platform__in=[p for p in adapter_platforms if p != WEB_PLATFORM])
    if web_users:
        target |= Q(session__platform=WEB_PLATFORM, session__user_id__in=list(web_users))
    # Rows past the offline expiry are never sent, even before the sweep has marked them failed.
    cutoff = timezone.now() - timedelta(seconds=config.offline_expiry_seconds)
    ids = list(
        Message.objects.filter(target, delivery_status=DeliveryStatus.PENDING, created_at__gte=cutoff)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    if not ids:
        return token, []
    now = timezone.now()
    Message.objects.filter(id__in=ids, delivery_status=DeliveryStatus.PENDING).update(
        delivery_status=DeliveryStatus.SENDING,
        delivery_claim=token,
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
    sessions = ChatSession.objects.in_bulk({row.session_id for row in rows})
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
            )
        )
    return token, deliveries


def outbox_finish(
    *, token: str, sent: Collection[int], released: Collection[int], failed: dict[int, DeliveryError]
) -> None:
    """Record a claimed batch's outcome: sent rows get delivered_at, released rows wait again."""
    now = timezone.now()
    held = Message.objects.filter(delivery_claim=token, delivery_status=DeliveryStatus.SENDING)
    if sent:
        held.filter(id__in=list(sent)).update(
            delivery_status=DeliveryStatus.SENT, delivered_at=now, delivery_claim="", delivery_lease_until=None
        )
    if released:
        held.filter(id__in=list(released)).update(
            delivery_status=DeliveryStatus.PENDING, delivery_claim="", delivery_lease_until=None
        )
    for message_id, error in failed.items():
        held.filter(id=message_id).update(
            delivery_status=DeliveryStatus.FAILED, delivery_error=error, delivery_claim="", delivery_lease_until=None
        )
        logger.warning("outbound message %s failed: %s", message_id, error)


def outbox_sweep(*, now=None) -> tuple[int, int]:
    """Fail rows that waited past the offline expiry, and rows whose claimer died mid-send."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=get_config().gateway.offline_expiry_seconds)
    expired = Message.objects.filter(
        direction=Direction.OUT, delivery_status=DeliveryStatus.PENDING, created_at__lt=cutoff
    ).update(delivery_status=DeliveryStatus.FAILED, delivery_error=DeliveryError.ADAPTER_OFFLINE)
    interrupted = Message.objects.filter(delivery_status=DeliveryStatus.SENDING, delivery_lease_until__lt=now).update(
        delivery_status=DeliveryStatus.FAILED,
        delivery_error=DeliveryError.INTERRUPTED,
        delivery_claim="",
        delivery_lease_until=None,
    )
    if expired:
        logger.warning("%d outbound messages failed: adapter offline longer than the expiry", expired)
    if interrupted:
        logger.warning("%d outbound messages failed: their sender died mid-send (not resent)", interrupted)
    return expired, interrupted


# --- the deliverer (async, in the ASGI process) ---------------------------------------------------


class Sink:
    """Where a claimed row goes: the registry of live connections in this process (chat.gateway)."""

    def adapter_platforms(self) -> Collection[str]: ...
    def web_users(self) -> Collection[str]: ...
    def accept_formats(self) -> dict[str, list[str]]: ...
    async def deliver(self, delivery: Delivery) -> bool:
        """Write the frame; False when the connection is gone (the row waits again)."""
        ...


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
        self.sent_total = 0

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
        last_sweep = 0.0
        while True:
            config = get_config().gateway  # read each round: a reload applies without a restart
            poll = config.outbox_poll_seconds_with_redis if settings.REDIS_URL else config.outbox_poll_seconds
            try:
                await asyncio.wait_for(self._event.wait(), timeout=poll)
            except TimeoutError:
                pass
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
        platforms = list(self.sink.adapter_platforms())
        users = list(self.sink.web_users())
        if not platforms and not users:
            return False
        token, batch = await self._claim(
            adapter_platforms=platforms, web_users=users, accept_formats=dict(self.sink.accept_formats())
        )
        if not batch:
            return False
        sent: list[int] = []
        released: list[int] = []
        failed: dict[int, DeliveryError] = {}
        gone: set[tuple[str, str]] = set()
        try:
            for delivery in batch:
                key = (delivery.platform, delivery.user_id if delivery.platform == WEB_PLATFORM else "")
                if delivery.error:
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
            await asyncio.shield(self._finish(token=token, sent=sent, released=released, failed=failed))
        self.sent_total += len(sent)
        return len(batch) >= BATCH_SIZE and not gone


# --- wake-ups from the send service -------------------------------------------------------------

_deliverer: Deliverer | None = None
_deliverer_lock = threading.Lock()


def set_deliverer(deliverer: Deliverer | None) -> None:
    global _deliverer
    with _deliverer_lock:
        _deliverer = deliverer


class OutboxWakePublisher:
    """Publishes `outbox.wake` to the channel layer group from sync code, without waiting for it.

    The send service's on_commit hook is sync and runs in any process (qcluster workers, management
    commands, the ASGI process's worker threads), while the channel layer is async. Rather than wrap the
    async call (async_to_sync), the hook hands the publish to an event loop and returns: the running
    one when the hook runs on a loop; in the ASGI process, the loop this process's deliverer runs on;
    elsewhere (qcluster workers, management commands) a daemon thread's own loop, started on first use
    in each process (a forked worker starts its own). The channel layer keeps its Redis connections per
    loop, so each of these loops uses its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._tasks: set[asyncio.Task] = set()  # a task nobody references may be collected mid-run

    def publish(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            task = running.create_task(self._send())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(self._report)
            return
        deliverer = _deliverer
        loop = deliverer.loop if deliverer is not None else None
        if loop is None or not loop.is_running():
            loop = self._own_loop()
        future = asyncio.run_coroutine_threadsafe(self._send(), loop)
        future.add_done_callback(self._report)

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="outbox-wake", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    @staticmethod
    async def _send() -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(OUTBOX_GROUP, {"type": "outbox.wake"})

    @staticmethod
    def _report(future: asyncio.Future | Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            # The rows are stored; pollers and the next wake deliver them. Never fail a send over this.
            logger.warning("could not publish the outbox wake-up: %s", future.exception())


wake_publisher = OutboxWakePublisher()


@receiver(outbound_created, dispatch_uid="chat.outbox.wake")
def _on_outbound_created(sender, messages, **kwargs) -> None:
    if _deliverer is not None:
        _deliverer.wake()
    if not settings.REDIS_URL:
        return  # the embedded default: other ASGI processes poll
    try:
        wake_publisher.publish()
    except Exception:
        logger.warning("could not publish the outbox wake-up", exc_info=True)
