"""`send_service.before_send` (chat.events): every outbound message's last stop before the outbox may
hand it to its adapter, as MaiBot's send service runs it before Platform IO.

While the point has a handler, the send service stores each outbound message as a pending row the
outbox does not claim yet (`delivery_error` = HELD: chat.outbox_rows skips it) and, once the row is
committed, runs the handlers here, on chat.events' background loop: no thread waits for them, so a slow
handler delays only its own chat's messages (one after the other per chat, so their order holds), each
handler cut at its timeout (at most `chat.tool_timeout`). Then the row is
- released: pending as any other (its text or segments as the handlers left them), and the outbox woken;
- failed with `hook_aborted: <handler>` when a handler aborted: visible in the console and the admin
  with the handler's name, never silently dropped (an operator may still resend it);
- failed with `before_send_not_run` when the handlers could not run (the chat's background backlog is
  full) or never finished (the server died meanwhile: the outbox sweep fails rows held longer than
  `hold_limit()`). Such a message is never sent unchecked.

A handler may change `text` and `segments` only: the chat, the sender and the row stay as they are
(a plugin cannot redirect a message). A malformed change (a blank text, nothing left to send, a segment
that is not an object with a type and data) is ignored and recorded as that handler's failure by
chat.events, like any malformed modification.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.dispatch import receiver

from chat import events
from chat.delivery_errors import HELD, DeliveryError
from chat.models import DeliveryStatus, Message
from chat.services import _announce, outbound_held, plain_text
from core.aio import db
from core.config import get_config

logger = logging.getLogger(__name__)

Point = events.Point.BEFORE_SEND
_locks: dict[int, asyncio.Lock] = {}  # per chat, on the background loop: its messages one at a time
_waiting: dict[int, int] = {}


def hold_limit() -> timedelta:
    """How long a held row may wait for its handlers before the sweep counts them dead: every handler
    at its longest, with the chain's grace, and a minute of slack."""
    count = max(1, len(events.handlers(Point)))
    return timedelta(seconds=count * (get_config().chat.tool_timeout + events.GRACE) + 60)


@receiver(outbound_held, dispatch_uid="chat.send_hooks.start")
def start(sender: Any = None, messages: Iterable[Message] = (), **kwargs: Any) -> None:
    """After the commit that stored held rows: run their handlers, per chat in order."""
    by_chat: dict[int, list[int]] = {}
    for message in messages:
        if message.delivery_error == HELD:
            by_chat.setdefault(message.session_id, []).append(message.pk)
    for chat, ids in by_chat.items():
        if why := events.run_background(_chat_run(chat, ids), chat):
            logger.warning("before_send for %d message(s) of chat %s not run: %s", len(ids), chat, why)
            _settle_now(ids, failed=f"{DeliveryError.HOOK_NOT_RUN}: {why}")


async def _chat_run(chat: int, ids: list[int]) -> None:
    lock = _locks.setdefault(chat, asyncio.Lock())
    _waiting[chat] = _waiting.get(chat, 0) + 1
    try:
        async with lock:
            for pk in ids:
                try:
                    await _one(pk)
                except Exception as exc:
                    logger.exception("before_send for outbound message %s failed", pk)
                    await _settle(pk, failed=f"{DeliveryError.HOOK_NOT_RUN}: {type(exc).__name__}"[:255])
    finally:
        _waiting[chat] -= 1
        if not _waiting[chat]:
            del _waiting[chat]
            _locks.pop(chat, None)


def _read(pk: int) -> Message | None:
    return Message.objects.select_related("session").filter(pk=pk, delivery_error=HELD).first()


async def _one(pk: int) -> None:
    message = await db(_read)(pk)
    if message is None:
        return  # settled meanwhile (an operator, the sweep)
    emission = await events.aemit(
        Point,
        message=message,
        session=message.session,
        text=message.text,
        segments=list(message.segments) if isinstance(message.segments, list) else [],
        reply_message_id=message.reply_to_platform_id,
    )
    if emission.aborted:
        await _settle(pk, failed=f"{DeliveryError.HOOK_ABORTED}: {emission.aborted_by}"[:255])
        return
    await _settle(pk, changes=_changes(message, emission))


def _changes(message: Message, emission: events.Emission) -> dict[str, Any]:
    """The row's new text and segments as the handlers left them ({}: unchanged; chat.events has
    checked each change). New segments carry their own text unless a handler set it too; a new text
    alone replaces the message's text segments."""
    text, segments = emission.kwargs["text"], emission.kwargs["segments"]
    original = message.segments if isinstance(message.segments, list) else []
    changes: dict[str, Any] = {}
    if segments != original:
        changes["segments"] = segments
        changes["text"] = text if text != message.text else plain_text(segments)
    elif text != message.text:
        changes["segments"] = _with_text(original, text)
        changes["text"] = text
    return changes


def _with_text(segments: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`segments` with their text replaced by `text` (where the first text segment was, else last)."""
    at = next((i for i, s in enumerate(segments) if s.get("type") == "text"), len(segments))
    rest = [s for s in segments if s.get("type") != "text"]
    at = min(at, len(rest))
    return [*rest[:at], {"type": "text", "data": text}, *rest[at:]]


def _settle_now(ids: list[int], *, failed: str = "", changes: dict[str, Any] | None = None) -> None:
    """Release the held rows (with `changes`), or fail them with `failed`; the outbox is woken."""
    held = Message.objects.filter(pk__in=ids, delivery_status=DeliveryStatus.PENDING, delivery_error=HELD)
    with transaction.atomic():
        if failed:
            done = held.update(delivery_status=DeliveryStatus.FAILED, delivery_error=failed[:255])
        else:
            done = held.update(delivery_error="", **(changes or {}))
    if done and not failed:
        transaction.on_commit(lambda: _announce(list(Message.objects.filter(pk__in=ids))))
    if done and failed:
        logger.warning("outbound message(s) %s not sent: %s", ids, failed)


async def _settle(pk: int, *, failed: str = "", changes: dict[str, Any] | None = None) -> None:
    await db(_settle_now)([pk], failed=failed, changes=changes)


def sweep(now: datetime) -> int:
    """Fail rows held longer than hold_limit(): their server died before their handlers finished."""
    stale = Message.objects.filter(
        delivery_status=DeliveryStatus.PENDING, delivery_error=HELD, created_at__lt=now - hold_limit()
    )
    failed = stale.update(
        delivery_status=DeliveryStatus.FAILED, delivery_error=f"{DeliveryError.HOOK_NOT_RUN}: held too long"
    )
    if failed:
        logger.warning("%d outbound messages failed: their before_send handlers never finished", failed)
    return failed
