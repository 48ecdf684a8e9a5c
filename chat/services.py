"""Every write to chat data: sessions, and the one send service all outbound messages go through."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from chat.fate import RESENDABLE
from chat.models import (
    ChatSession,
    ChatType,
    DeliveryStatus,
    Direction,
    Message,
    SourceKind,
    make_session_id,
)

logger = logging.getLogger(__name__)

# Sent after the transaction that put outbound messages in the outbox commits, in the process that wrote
# them: the gateway wakes its outbox deliverer, the planner appends them to a live runtime's history.
# kwargs: messages (list[Message]), resent (bool: messages an operator put back, already in the history).
outbound_created = Signal()

# Sent by the gateway, in the ASGI process, once inbound messages are stored: the planner's runtime
# registry listens and wakes the session's loop. kwargs: messages (list[Message]).
inbound_stored = Signal()


def session_get_or_create(
    *,
    platform: str,
    chat_type: str,
    user_id: str = "",
    user_nickname: str = "",
    user_cardname: str = "",
    group_id: str = "",
    group_name: str = "",
) -> ChatSession:
    """The conversation for this platform target, created on first sight; names kept current."""
    if chat_type not in ChatType.values:
        raise ValueError(f"unknown chat type {chat_type!r}")
    target = group_id if chat_type == ChatType.GROUP else user_id
    if not target:
        raise ValueError("a private chat needs a user id and a group chat a group id")
    if chat_type == ChatType.GROUP:
        # A group's identity is the group; who spoke is on each message, not on the session.
        user_id = user_nickname = user_cardname = ""
    session_id = make_session_id(platform, chat_type, str(target))
    defaults = {
        "platform": platform,
        "chat_type": chat_type,
        "user_id": str(user_id),
        "user_nickname": user_nickname or "",
        "user_cardname": user_cardname or "",
        "group_id": str(group_id),
        "group_name": group_name or "",
    }
    session, created = ChatSession.objects.get_or_create(session_id=session_id, defaults=defaults)
    if not created:
        changed = {
            k: v
            for k, v in defaults.items()
            if v and k in {"user_id", "user_nickname", "user_cardname", "group_name"} and getattr(session, k) != v
        }
        if changed:
            for k, v in changed.items():
                setattr(session, k, v)
            session.save(update_fields=list(changed))
    return session


def text_segments(text: str, *, reply_to_platform_id: str = "") -> list[dict[str, Any]]:
    """The seglist for a plain text message, quoting a platform message when asked."""
    segments: list[dict[str, Any]] = []
    if reply_to_platform_id:
        segments.append({"type": "reply", "data": str(reply_to_platform_id)})
    if text:
        segments.append({"type": "text", "data": text})
    return segments


def plain_text(segments: Sequence[dict[str, Any]]) -> str:
    """A readable text rendering of segments, for history windows and the admin."""
    parts: list[str] = []
    for seg in segments:
        kind, data = seg.get("type"), seg.get("data")
        if kind == "text":
            parts.append(str(data))
        elif kind == "seglist" and isinstance(data, list):
            parts.append(plain_text(data))
        elif kind == "reply":
            continue
        else:
            parts.append(f"[{kind}]")
    return "".join(parts)


@dataclass
class Outbound:
    """One message to send: to a session, as segments, from a source."""

    session: ChatSession
    source_kind: str
    text: str = ""
    segments: list[dict[str, Any]] = field(default_factory=list)
    reply_to_platform_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _build_message(item: Outbound, now: datetime) -> Message:
    if item.source_kind not in SourceKind.values or item.source_kind == SourceKind.USER:
        raise ValueError(f"not an outbound source kind: {item.source_kind!r}")
    segments = item.segments or text_segments(item.text, reply_to_platform_id=item.reply_to_platform_id)
    if not segments:
        raise ValueError("an outbound message needs text or segments")
    if item.reply_to_platform_id and item.segments:
        segments = [{"type": "reply", "data": str(item.reply_to_platform_id)}, *segments]
    session = item.session
    return Message(
        session=session,
        direction=Direction.OUT,
        source_kind=item.source_kind,
        sender_id="",
        receiver_id=session.target_id,
        segments=segments,
        text=item.text or plain_text(segments),
        reply_to_platform_id=item.reply_to_platform_id,
        extra=item.extra,
        time=now,
        delivery_status=DeliveryStatus.PENDING,
    )


def messages_send(items: Sequence[Outbound], *, now: datetime | None = None) -> list[Message]:
    """The send service: store outbound messages as pending outbox rows, in one transaction.

    The ASGI side delivers pending rows to the adapter of their platform (chat.outbox). Call inside
    a caller's transaction to make the send atomic with the caller's own writes.
    """
    now = now or timezone.now()
    messages = [_build_message(item, now) for item in items]
    with transaction.atomic():
        Message.objects.bulk_create(messages)
        session_ids = {m.session_id for m in messages}
        ChatSession.objects.filter(pk__in=session_ids).update(last_active_at=now)
        transaction.on_commit(lambda: _announce(messages))
    return messages


def message_send(
    *,
    session: ChatSession,
    source_kind: str,
    text: str = "",
    segments: list[dict[str, Any]] | None = None,
    reply_to_platform_id: str = "",
    extra: dict[str, Any] | None = None,
) -> Message:
    """Send one message through the send service (see messages_send)."""
    item = Outbound(
        session=session,
        source_kind=source_kind,
        text=text,
        segments=list(segments or []),
        reply_to_platform_id=reply_to_platform_id,
        extra=dict(extra or {}),
    )
    return messages_send([item])[0]


def message_hooks_apply(*, message: Message, text: str | None = None, aborted_by: str = "") -> None:
    """What the receive hook points (chat.events) did to an inbound message: its text rewritten, or
    the handler that stopped it (kept in `extra["hook_aborted_by"]`; the message is never planned)."""
    fields = []
    if text is not None and text != message.text:
        message.text = text
        fields.append("text")
    if aborted_by:
        message.extra = {**(message.extra or {}), "hook_aborted_by": aborted_by[:200]}
        fields.append("extra")
    if fields:
        message.save(update_fields=fields)


def messages_resend(*, message_ids: Iterable[int], by: str, now: datetime | None = None) -> list[Message]:
    """Put unconfirmed or failed outbound messages back in the outbox with a fresh attempt budget.

    Each row moves with one conditional UPDATE that holds only while the row is still as it was read
    (same state, same attempt count), so a resend never races the deliverer, a late echo that marks it
    delivered, or a second operator: a row that changed meanwhile is left alone. What it had come to
    (state, reason, attempts, last hand-over, when it was queued) is kept in `extra["resends"]`. The row
    counts as queued now (`created_at`), so the offline expiry gives it its full wait again.
    Returns the messages put back.
    """
    now = now or timezone.now()
    resent: list[Message] = []
    with transaction.atomic():
        candidates = Message.objects.filter(
            id__in=list(message_ids), direction=Direction.OUT, delivery_status__in=RESENDABLE
        ).order_by("id")
        for message in candidates:
            record = {
                "at": now.isoformat(),
                "by": by,
                "status": message.delivery_status,
                "error": message.delivery_error,
                "attempts": message.delivery_attempts,
                "sent_at": message.sent_at.isoformat() if message.sent_at else None,
                "queued_at": message.created_at.isoformat(),
            }
            extra = message.extra if isinstance(message.extra, dict) else {"extra": message.extra}
            extra = {**extra, "resends": [*extra.get("resends", []), record]}
            updated = Message.objects.filter(
                id=message.id, delivery_status=message.delivery_status, delivery_attempts=message.delivery_attempts
            ).update(
                delivery_status=DeliveryStatus.PENDING,
                delivery_error="",
                delivery_attempts=0,
                delivery_claim="",
                delivery_lease_until=None,
                next_attempt_at=None,
                created_at=now,
                extra=extra,
            )
            if updated:
                message.delivery_status, message.delivery_error = DeliveryStatus.PENDING, ""
                message.delivery_attempts, message.created_at, message.extra = 0, now, extra
                resent.append(message)
        if resent:
            transaction.on_commit(lambda: _announce(resent, resent=True))
    for message in resent:
        record = message.extra["resends"][-1]
        logger.info(
            "outbound message %s resent by %s (was %s %s after %d attempt(s))",
            message.pk, by, record["status"], record["error"] or "-", record["attempts"],
        )  # fmt: skip
    return resent


def _announce(messages: list[Message], *, resent: bool = False) -> None:
    # send_robust: one listener's failure must never block the others or a committed send.
    for receiver, result in outbound_created.send_robust(sender=Message, messages=messages, resent=resent):
        if isinstance(result, Exception):
            logger.error("outbound_created listener %r failed: %s", receiver, result, exc_info=result)
