"""Every write to chat data: sessions, and the one send service all outbound messages go through."""

from __future__ import annotations

import functools
import logging
import operator
import os
import sqlite3
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, models, transaction
from django.dispatch import Signal
from django.utils import timezone

from chat import events
from chat.delivery_errors import HELD
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
# Sent (after the commit) with outbound messages stored held for their send_service.before_send handlers,
# which chat.send_hooks runs; the outbox claims none of them before it releases them.
outbound_held = Signal()

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


# Checked per outbound message: computed once (a TextChoices' `values` is rebuilt on every access).
OUTBOUND_SOURCE_KINDS = frozenset(SourceKind.values) - {SourceKind.USER.value}


@functools.cache
def message_defaults() -> list[tuple[str, Any]]:
    """(attname, default) of every Message column in order, for positional construction."""
    defaults = []
    for f in Message._meta.concrete_fields:
        # Callable defaults (the uid) are always given explicitly, so only constants are cached.
        defaults.append(
            (f.attname, None if f.primary_key or (f.has_default() and callable(f.default)) else f.get_default())
        )
    return defaults


def _build_message(item: Outbound, now: datetime, random: bytes, held: bool = False) -> Message:
    if item.source_kind not in OUTBOUND_SOURCE_KINDS:
        raise ValueError(f"not an outbound source kind: {item.source_kind!r}")
    segments = item.segments or text_segments(item.text, reply_to_platform_id=item.reply_to_platform_id)
    if not segments:
        raise ValueError("an outbound message needs text or segments")
    if item.reply_to_platform_id and item.segments:
        segments = [{"type": "reply", "data": str(item.reply_to_platform_id)}, *segments]
    session = item.session
    values = {
        "uid": uuid.UUID(bytes=random, version=4),
        "session_id": session.pk,
        "direction": Direction.OUT.value,
        "source_kind": item.source_kind,
        "receiver_id": session.target_id,
        "segments": segments,
        "text": item.text or plain_text(segments),
        "reply_to_platform_id": item.reply_to_platform_id,
        "extra": item.extra,
        "time": now,
        "created_at": now,
        "delivery_status": DeliveryStatus.PENDING.value,
        # Not claimed until the send_service.before_send handlers have had their say (chat.send_hooks).
        "delivery_error": HELD if held else "",
    }
    # Positional construction skips Model.__init__'s keyword handling (a burst builds thousands).
    message = Message(*[values.get(name, default) for name, default in message_defaults()])
    Message.session.field.set_cached_value(message, session)
    return message


def messages_insert(messages: list[Message], now: datetime) -> None:
    """bulk_create for a burst of rows (inbound or outbound), minus the ORM's per-value SQL compilation.

    Profiling the ingest path and the dispatcher showed bulk_create spending most of its time compiling
    each value of each row (and Django's 999-parameter cap for SQLite splitting a batch into ~45-row
    statements). Values prepared by the fields themselves (only where a conversion is needed) in
    multi-row INSERTs as large as the database takes write the same rows several times faster. The
    ids come back by RETURNING, matched by uid (neither database promises RETURNING's row order).
    """
    _insert_rows(messages, _rows_for(messages, now))


def _rows_for(messages: list[Message], now: datetime) -> list[list[Any]]:
    """Each message's column values as the driver takes them (no database access)."""
    conn = connections[Message.objects.db]
    fields = _insert_fields()
    plain = (models.CharField, models.TextField, models.IntegerField, models.BooleanField, models.ForeignKey)
    # Only JSON, UUID and datetime columns need converting for the driver; the rest go as they are.
    convert = [(i, f) for i, f in enumerate(fields) if not isinstance(f, plain)]
    row_of = operator.attrgetter(*(f.attname for f in fields))
    shared: dict[int, Any] = {}  # the batch's one timestamp object, converted once
    rows = []
    for m in messages:
        m.created_at = now
        row = list(row_of(m))
        for i, f in convert:
            v = row[i]
            if v is None:
                continue
            if v is now:
                if i not in shared:
                    shared[i] = f.get_db_prep_save(v, conn)
                row[i] = shared[i]
            else:
                row[i] = f.get_db_prep_save(v, conn)
        rows.append(row)
    return rows


def _insert_fields() -> list[models.Field]:
    return [f for f in Message._meta.concrete_fields if not f.primary_key]


def _insert_rows(messages: list[Message], rows: list[list[Any]]) -> None:
    if not rows:
        return
    conn = connections[Message.objects.db]  # the wrapper itself, not the per-access proxy
    fields = _insert_fields()
    uid_index = next(i for i, f in enumerate(fields) if f.attname == "uid")
    # The uid as the driver gets it back (hex text on SQLite, a UUID on PostgreSQL).
    by_uid = {row[uid_index]: m for row, m in zip(rows, messages, strict=True)}
    qn = conn.ops.quote_name
    head = "INSERT INTO {} ({}) ".format(qn(Message._meta.db_table), ", ".join(qn(f.column) for f in fields))
    tail = f" RETURNING {qn(Message._meta.pk.column)}, {qn(fields[uid_index].column)}"
    if conn.vendor == "postgresql":
        # One array per column: a short statement whatever the number of rows. psycopg parses a
        # statement's placeholders in Python and caches only short ones, so a multi-row VALUES list
        # cost more there than the insert itself.
        arrays = ", ".join(f"%s::{f.db_type(conn)}[]" for f in fields)
        statements = [
            (f"{head}SELECT * FROM unnest({arrays}){tail}", [list(column) for column in zip(*rows, strict=True)])
        ]
    else:
        one = "({})".format(", ".join(["%s"] * len(fields)))
        per_statement = max(1, min(_MAX_ROWS_PER_INSERT, _max_parameters(conn) // len(fields)))
        statements = [
            (head + "VALUES " + ", ".join([one] * len(chunk)) + tail, [v for row in chunk for v in row])
            for chunk in (rows[start : start + per_statement] for start in range(0, len(rows), per_statement))
        ]
    with conn.cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params)
            for pk, uid in cursor.fetchall():
                by_uid[uid].pk = pk
    for m in messages:
        m._state.adding = False
        m._state.db = conn.alias


# Rows per INSERT at most, whatever the database would take: statements stay a few hundred kB.
_MAX_ROWS_PER_INSERT = 2000


def _max_parameters(conn) -> int:
    """Bind parameters one SQLite statement may carry: its compiled-in limit (Django assumes 999, the
    limit before SQLite 3.32; builds since allow 32,766)."""
    if conn.vendor == "sqlite":
        conn.ensure_connection()
        return conn.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return conn.features.max_query_params or 999


@dataclass
class PreparedSend:
    """Outbound messages built and converted for the database, not yet written: what messages_send
    does before its transaction, so that a caller writing inside a transaction of its own (the
    dispatcher; on SQLite every transaction holds the one write lock from its start) does that work
    before taking it."""

    messages: list[Message]
    rows: list[list[Any]]
    now: datetime

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def subset(self, indexes: Iterable[int]) -> PreparedSend:
        """Only the messages at these positions (in the order given)."""
        indexes = list(indexes)
        return PreparedSend([self.messages[i] for i in indexes], [self.rows[i] for i in indexes], self.now)


def messages_prepare(items: Sequence[Outbound], *, now: datetime | None = None) -> PreparedSend:
    """Build and convert outbound messages for messages_send, without touching the database."""
    now = now or timezone.now()
    # One getrandom call for the batch's uids rather than one per message.
    random = os.urandom(16 * len(items))
    held = events.has_handlers(events.Point.BEFORE_SEND)
    messages = [_build_message(item, now, random[16 * i : 16 * i + 16], held) for i, item in enumerate(items)]
    return PreparedSend(messages, _rows_for(messages, now), now)


def messages_send(items: Sequence[Outbound] | PreparedSend, *, now: datetime | None = None) -> list[Message]:
    """The send service: store outbound messages as pending outbox rows, in one transaction.

    The ASGI side delivers pending rows to the adapter of their platform (chat.outbox). Call inside
    a caller's transaction to make the send atomic with the caller's own writes (with `items` from
    messages_prepare, made before that transaction began).
    """
    prepared = items if isinstance(items, PreparedSend) else messages_prepare(items, now=now)
    messages = prepared.messages
    with transaction.atomic():
        _insert_rows(messages, prepared.rows)
        session_ids = {m.session_id for m in messages}
        ChatSession.objects.filter(pk__in=session_ids).update(last_active_at=prepared.now)
        transaction.on_commit(lambda: _announce(messages))
        if any(m.delivery_error == HELD for m in messages):
            transaction.on_commit(lambda: outbound_held.send(sender=Message, messages=messages))
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
