"""The outbox: delivering pending outbound Message rows to the connected adapter (or browser) of their platform.

Rows are claimed with a conditional UPDATE (pending → sending, with a claim token and a lease), so
several ASGI processes never send one row twice; each process claims only rows it can deliver (the
platforms, and the browser users, connected to it). A row is marked sent once its frame has been
handed to the socket. Delivery is at most once: a row whose claimer died mid-send (lease run out)
fails with `delivery_interrupted` rather than risk a second copy on the platform. Rows waiting for
an offline adapter longer than `gateway.offline_expiry_seconds` fail with `adapter_offline`.

Wake-ups: the send service's `outbound_created` signal wakes this process's deliverer at once; with
REDIS_URL it also reaches every ASGI process through the channel layer group `maibot.outbox`; without
Redis the deliverer polls every `POLL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import F, Q
from django.dispatch import receiver
from django.utils import timezone

from chat.envelope import MEDIA_SEGMENT_TYPES, wire_id
from chat.models import ChatSession, DeliveryStatus, Direction, Media, Message
from chat.services import outbound_created
from maibot.config import get_config

logger = logging.getLogger(__name__)

WEB_PLATFORM = "web"
OUTBOX_GROUP = "maibot.outbox"
# Without Redis the ASGI side finds rows written by other processes only by polling; with Redis every
# send wakes it through the channel layer and the poll is a slow safety net.
POLL_SECONDS = 0.2
POLL_SECONDS_WITH_REDIS = 5.0
LEASE_SECONDS = 60.0
BATCH_SIZE = 500
SWEEP_SECONDS = 1.0


class DeliveryError:
    ADAPTER_OFFLINE = "adapter_offline"
    INTERRUPTED = "delivery_interrupted"
    UNSUPPORTED = "unsupported_segments"
    MEDIA_MISSING = "media_missing"
    BAD_MESSAGE = "bad_message"


@dataclass
class Delivery:
    """One claimed row, with the frame to write and where to write it."""

    message_id: int
    platform: str
    session_id: str
    user_id: str  # the browser user for platform `web`
    frame: dict[str, Any] | None
    error: str = ""


# --- building frames -----------------------------------------------------------------------------


def _media_base64(sha: str, kind: str) -> str | None:
    media = Media.objects.filter(sha256=sha, kind=kind).first() or Media.objects.filter(sha256=sha).first()
    if media is None:
        return None
    try:
        with media.file.open("rb") as fh:
            return base64.b64encode(fh.read()).decode("ascii")
    except OSError as exc:
        logger.error("media %s (%s) cannot be read: %s", sha[:12], kind, exc)
        return None


def _adapter_segments(segments: list[dict[str, Any]], accept: set[str] | None) -> tuple[list[dict[str, Any]], str]:
    out: list[dict[str, Any]] = []
    for seg in segments:
        kind, data = seg.get("type"), seg.get("data")
        if kind == "seglist" and isinstance(data, list):
            inner, error = _adapter_segments(data, accept)
            if error:
                return [], error
            if inner:
                out.append({"type": "seglist", "data": inner})
            continue
        if accept is not None and kind not in accept:
            logger.info("segment type %r dropped: not in the adapter's accept_format", kind)
            continue
        if kind in MEDIA_SEGMENT_TYPES and isinstance(data, dict) and data.get("media"):
            encoded = _media_base64(str(data["media"]), kind)
            if encoded is None:
                return [], DeliveryError.MEDIA_MISSING
            data = encoded
        out.append({"type": kind, "data": data})
    return out, ""


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


def adapter_envelope(
    message: OutboundRow | Message, session: ChatSession, accept_format: list[str] | None
) -> tuple[dict, str]:
    """The maim_message envelope for one outbound message, or ("", error) when nothing sendable is left.

    A private message names the recipient in user_info (the adapter sends to user_info.user_id); a
    group message names the group. Only segment types the adapter declared in accept_format are sent.
    """
    accept = set(accept_format) if accept_format else None
    segments, error = _adapter_segments(list(message.segments), accept)
    if error:
        return {}, error
    if not segments:
        return {}, DeliveryError.UNSUPPORTED
    info: dict[str, Any] = {
        "platform": session.platform,
        "message_id": str(message.uid),
        "time": message.time.timestamp(),
    }
    if session.is_private:
        info["user_info"] = {
            "platform": session.platform,
            "user_id": wire_id(session.user_id),
            "user_nickname": session.user_nickname,
            "user_cardname": session.user_cardname,
        }
    else:
        info["group_info"] = {
            "platform": session.platform,
            "group_id": wire_id(session.group_id),
            "group_name": session.group_name,
        }
    info["additional_config"] = {}
    # A lone command goes out as the top-level segment, as adapters expect it.
    if len(segments) == 1 and segments[0]["type"] == "command":
        top = segments[0]
    else:
        top = {"type": "seglist", "data": segments}
    return {"message_info": info, "message_segment": top, "raw_message": message.text}, ""


def browser_frame(message: OutboundRow | Message) -> dict[str, Any]:
    """What the browser chat page receives for a message of its session."""
    return {
        "type": "message",
        "uid": str(message.uid),
        "direction": message.direction,
        "source_kind": message.source_kind,
        "text": message.text,
        "segments": message.segments,
        "time": timezone.localtime(message.time, get_config().tzinfo).isoformat(),
    }


# --- the outbox service (sync; the deliverer calls it with sync_to_async) -------------------------


def outbox_claim(
    *,
    adapter_platforms: Collection[str],
    web_users: Collection[str],
    accept_formats: dict[str, list[str]],
    limit: int = BATCH_SIZE,
    lease_seconds: float = LEASE_SECONDS,
) -> tuple[str, list[Delivery]]:
    """Claim up to `limit` pending rows this process can deliver, oldest first, with their frames."""
    token = uuid.uuid4().hex
    target = Q(session__platform__in=[p for p in adapter_platforms if p != WEB_PLATFORM])
    if web_users:
        target |= Q(session__platform=WEB_PLATFORM, session__user_id__in=list(web_users))
    # Rows past the offline expiry are never sent, even before the sweep has marked them failed.
    cutoff = timezone.now() - timedelta(seconds=get_config().gateway.offline_expiry_seconds)
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
                frame, error = browser_frame(row), ""
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


def outbox_finish(*, token: str, sent: Collection[int], released: Collection[int], failed: dict[int, str]) -> None:
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


def _db_call(executor: ThreadPoolExecutor, fn: Callable) -> Callable:
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
        self._claim = _db_call(self.executor, outbox_claim)
        self._finish = _db_call(self.executor, outbox_finish)
        self._sweep = _db_call(self.executor, outbox_sweep)
        self.sent_total = 0

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
        poll = POLL_SECONDS_WITH_REDIS if settings.REDIS_URL else POLL_SECONDS
        while True:
            try:
                await asyncio.wait_for(self._event.wait(), timeout=poll)
            except TimeoutError:
                pass
            self._event.clear()
            try:
                if self._loop.time() - last_sweep >= SWEEP_SECONDS:
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
        failed: dict[int, str] = {}
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


async def _group_wake() -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(OUTBOX_GROUP, {"type": "outbox.wake"})


@receiver(outbound_created, dispatch_uid="chat.outbox.wake")
def _on_outbound_created(sender, messages, **kwargs) -> None:
    if _deliverer is not None:
        _deliverer.wake()
    if not settings.REDIS_URL:
        return  # the embedded default: other ASGI processes poll
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    try:
        if loop is not None:
            loop.create_task(_group_wake())
        else:
            async_to_sync(_group_wake)()
    except Exception:
        # The rows are stored; pollers and the next wake deliver them. Never fail a send over this.
        logger.warning("could not publish the outbox wake-up", exc_info=True)
