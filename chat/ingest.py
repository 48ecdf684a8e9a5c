"""Storing what adapters send: inbound chat messages (with their media), send receipts, command results."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import InterfaceError, OperationalError, connections, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from chat.accounts import bot_account_learn
from chat.delivery_gate import outbox_platform_reconnected, outbox_unproven_reconnected
from chat.media import MediaError, decode_base64, media_store
from chat.models import (
    AdapterConnection,
    AdapterPlatform,
    ChatSession,
    ChatType,
    CommandResponse,
    DeliveryStatus,
    Direction,
    Message,
    SourceKind,
)
from chat.services import message_defaults, messages_insert, plain_text, session_get_or_create
from chat.wire.inbound import MEDIA_SEGMENT_TYPES, InboundMessage
from core.retry import batch_or_each

logger = logging.getLogger(__name__)

STORE_ATTEMPTS = 4


@dataclass
class InboundItem:
    """One parsed inbound message as it came off a connection."""

    platform: str
    message: InboundMessage
    # When the frame arrived (epoch seconds), for latency figures in logs and benchmarks.
    received_at: float = 0.0
    # The adapter says the message addresses the bot (an adapter plugin's MessageDict `is_mentioned`);
    # kept as extra["mentioned"], which chat.planner.rules.mentions_bot honours. A /ws frame cannot set it.
    mentioned: bool = False


@dataclass
class IngestResult:
    stored: list[Message] = field(default_factory=list)
    rejected: int = 0


def _store_media(segments: list[dict[str, Any]], media_cache: dict[tuple[str, str], str]) -> list[dict[str, Any]]:
    """Replace base64 media with references to stored Media rows (stored once by hash)."""
    out: list[dict[str, Any]] = []
    for seg in segments:
        kind, data = seg["type"], seg.get("data")
        if kind == "seglist" and isinstance(data, list):
            out.append({"type": "seglist", "data": _store_media(data, media_cache)})
        elif kind in MEDIA_SEGMENT_TYPES and isinstance(data, str) and data:
            key = (kind, data[:64] + str(len(data)) + data[-64:])
            sha = media_cache.get(key)
            if sha is None:
                try:
                    sha = media_store(data=decode_base64(data), kind=kind).sha256
                except MediaError as exc:
                    # Keep the rest of the message; the broken segment says what was wrong.
                    logger.warning("inbound %s segment not stored: %s", kind, exc)
                    out.append({"type": kind, "data": {"error": str(exc)}})
                    continue
                media_cache[key] = sha
            out.append({"type": kind, "data": {"media": sha}})
        else:
            out.append(seg)
    return out


def _message_time(value: float | None, now: datetime) -> datetime:
    # Adapters send epoch seconds; anything absurd (missing, milliseconds, far future) becomes now.
    if value is None or not (0 < value < now.timestamp() + 86400):
        return now
    return datetime.fromtimestamp(value, tz=UTC)


def _session_key(item: InboundItem) -> tuple[str, str, str]:
    info = item.message.info
    if item.message.is_group:
        return (item.platform, ChatType.GROUP, str(info.group_info.group_id))
    return (item.platform, ChatType.PRIVATE, str(info.user_info.user_id))


# (platform, chat type, target) -> (the arguments last applied, the session). A burst from one chat
# resolves its session once, not once per batch; filled only after the batch committed, and emptied
# when a batch fails (a session may have been deleted).
_session_cache: dict[tuple[str, str, str], tuple[tuple, ChatSession]] = {}
SESSION_CACHE_SIZE = 10_000


def _sessions_for(
    items: Sequence[InboundItem],
    keys: Sequence[tuple[str, str, str]],
    learned: dict[tuple[str, str, str], tuple[tuple, ChatSession]],
) -> dict[tuple[str, str, str], ChatSession]:
    """The session of each key (`keys[i]` is `_session_key(items[i])`)."""
    # The last message of each chat carries the freshest names.
    latest: dict[tuple[str, str, str], InboundItem] = dict(zip(keys, items, strict=True))
    sessions = {}
    for key, item in latest.items():
        info = item.message.info
        user = info.user_info
        group = info.group_info
        if key[1] == ChatType.GROUP:
            # The session is the group: its speakers are on their messages (so a new speaker costs no write).
            args = {
                "platform": item.platform,
                "chat_type": key[1],
                "group_id": key[2],
                "group_name": (group.group_name or "") if group else "",
            }
        else:
            args = {
                "platform": item.platform,
                "chat_type": key[1],
                "user_id": (user.user_id or "") if user else "",
                "user_nickname": (user.user_nickname or "") if user else "",
                "user_cardname": (user.user_cardname or "") if user else "",
            }
        signature = tuple(args.values())
        cached = _session_cache.get(key)
        if cached is not None and cached[0] == signature:
            sessions[key] = cached[1]
            continue
        sessions[key] = session_get_or_create(**args)
        learned[key] = (signature, sessions[key])
    return sessions


def _build(item: InboundItem, session: ChatSession, now: datetime, media_cache: dict, random: bytes) -> Message:
    info = item.message.info
    user = info.user_info
    additional = dict(info.additional_config or {})
    segments = _store_media(item.message.segments, media_cache)
    reply_to = additional.get("reply_message_id")
    extra: dict[str, Any] = {}
    if additional:
        extra["additional_config"] = additional
    if item.mentioned:
        extra["mentioned"] = True
    receiver = info.receiver_info.user_info if info.receiver_info else None
    values = {
        "uid": uuid.UUID(bytes=random, version=4),
        "session_id": session.pk,
        "direction": Direction.IN,
        "source_kind": SourceKind.USER,
        "platform_message_id": (info.message_id or "")[:128],
        "sender_id": ((user.user_id or "") if user else "")[:128],
        "sender_nickname": ((user.user_nickname or "") if user else "")[:255],
        "sender_cardname": ((user.user_cardname or "") if user else "")[:255],
        "receiver_id": ((receiver.user_id or "") if receiver else "")[:128],
        "segments": segments,
        "text": plain_text(segments),
        "reply_to_platform_id": str(reply_to)[:128] if reply_to not in (None, "") else "",
        "extra": extra,
        "time": _message_time(info.time, now),
        "created_at": now,
    }
    # Positional construction skips Model.__init__'s keyword handling: a quarter of the ingest cost
    # for a burst. Fields not named above take their defaults.
    message = Message(*[values.get(name, default) for name, default in message_defaults()])
    Message.session.field.set_cached_value(message, session)
    # Lets the caller tell which stored row came from which frame (the browser page confirms its own).
    message.inbound_item = item
    return message


def _store(items: Sequence[InboundItem]) -> list[Message]:
    now = timezone.now()
    learned: dict = {}
    # One getrandom call for the batch's uids rather than one per message (a tenth of the cost).
    random = os.urandom(16 * len(items))
    with transaction.atomic():
        keys = [_session_key(item) for item in items]
        sessions = _sessions_for(items, keys, learned)
        media_cache: dict = {}
        messages = [
            _build(item, sessions[key], now, media_cache, random[16 * i : 16 * i + 16])
            for i, (item, key) in enumerate(zip(items, keys, strict=True))
        ]
        messages_insert(messages, now)
        ChatSession.objects.filter(pk__in={s.pk for s in sessions.values()}).update(last_active_at=now)
    if len(_session_cache) + len(learned) > SESSION_CACHE_SIZE:
        _session_cache.clear()
    _session_cache.update(learned)
    return messages


def inbound_messages_store(*, items: Sequence[InboundItem]) -> IngestResult:
    """Store inbound messages, creating their sessions; one transaction for the batch.

    When the batch fails, each message is stored in its own transaction so one bad message never
    costs the others; a message that still fails is logged and counted, never half-stored.
    """
    if not items:
        return IngestResult()
    for attempt in range(1, STORE_ATTEMPTS + 1):
        try:
            return IngestResult(stored=_store(items))
        except (OperationalError, InterfaceError):
            _session_cache.clear()
            # The database is unreachable or busy, not the data wrong: nothing of the batch was
            # written, so wait and write it again rather than drop what the adapters sent.
            logger.exception("inbound batch of %d not stored (attempt %d of %d)", len(items), attempt, STORE_ATTEMPTS)
            connections[Message.objects.db].close()
            if attempt < STORE_ATTEMPTS:
                time.sleep(attempt)
        except Exception:
            # A cached session may have been deleted meanwhile: forget them, and store one by one
            # (a single message gets its second try there).
            _session_cache.clear()
            logger.exception("inbound batch of %d failed; storing one by one", len(items))
            break
    result = IngestResult()
    for item in items:
        try:
            result.stored.extend(_store([item]))
        except Exception:
            logger.exception("inbound message from %s not stored", item.platform)
            result.rejected += 1
    return result


def outbound_receipt_apply(*, platform: str, echo: Any, actual_id: Any) -> bool:
    """`message_id_echo` from `platform`'s adapter: record the platform's id for one of our outbound
    messages (matched by uid) and mark it delivered. Only a message of that platform that was handed
    over counts: claimed for the hand-over (`sending`: the echo may overtake the mark of its
    hand-over) or handed over at least once (`sent_at` set: sent, unconfirmed, delivered, or pending
    again after a missed confirm deadline). An echo naming a message of another platform, or one never
    handed over, changes nothing."""
    try:
        uid = uuid.UUID(str(echo))
    except ValueError:
        logger.warning("receipt from %s names no message of ours: echo=%r", platform, echo)
        return False
    if actual_id in (None, ""):
        logger.warning("receipt from %s for %s carries no actual_id", platform, uid)
        return False
    now = timezone.now()
    handed_over = Q(sent_at__isnull=False) | Q(delivery_status=DeliveryStatus.SENDING)
    updated = Message.objects.filter(handed_over, uid=uid, direction=Direction.OUT, session__platform=platform).update(
        platform_message_id=str(actual_id)[:128],
        delivery_status=DeliveryStatus.DELIVERED,
        delivered_at=now,
        sent_at=Coalesce(F("sent_at"), now),
        delivery_error="",
        delivery_claim="",
        delivery_lease_until=None,
        next_attempt_at=None,
    )
    if not updated:
        logger.warning("receipt from %s for %s ignored: no message of that platform handed over with it", platform, uid)
    return bool(updated)


def command_response_store(*, platform: str, content: Any) -> CommandResponse:
    """`command_response`: keep the adapter's command result as it came."""
    payload = content if isinstance(content, dict) else {"content": content}
    response = CommandResponse.objects.create(
        platform=platform[:64],
        command_name=str(payload.get("command_name") or "")[:128],
        success=payload.get("success") is True,
        payload=payload,
    )
    logger.info("command_response from %s: %s success=%s", platform, response.command_name or "?", response.success)
    return response


@dataclass
class AdapterFrames:
    """What one writer round took off the queue: messages, receipts and command results."""

    messages: list[InboundItem] = field(default_factory=list)
    receipts: list[tuple[str, Any]] = field(default_factory=list)  # (platform, content)
    command_responses: list[tuple[str, Any]] = field(default_factory=list)


def _learn_bot_accounts(stored: Sequence[Message]) -> None:
    """An adapter that names the receiver (receiver_info) tells us the bot's own account."""
    told = {m.inbound_item.platform: m.receiver_id for m in stored if m.receiver_id and hasattr(m, "inbound_item")}
    for platform, account in told.items():
        try:
            bot_account_learn(platform, account)
        except Exception:
            logger.exception("the bot's %s account could not be recorded", platform)


def adapter_platforms_echoed(*, platforms: set[str], now: datetime | None = None) -> None:
    """Note that these platforms' adapters echoed: from their first echo on, a hand-over without one is
    redelivered (chat.outbox). One statement per platform, whatever the number of echoes."""
    now = now or timezone.now()
    for platform in platforms:
        known = AdapterPlatform.objects.filter(platform=platform).update(
            last_echo_at=now, first_echo_at=Coalesce(F("first_echo_at"), Value(now)), no_echo_at=None, updated_at=now
        )
        if not known:
            AdapterPlatform.objects.get_or_create(
                platform=platform, defaults={"first_echo_at": now, "last_echo_at": now}
            )
            logger.info("platform %s echoes deliveries: unconfirmed hand-overs are redelivered from now on", platform)


def _receipts_apply(receipts: list[tuple[str, Any]]) -> None:
    """The round's echoes and the note that their platforms echo, committed together: no reader sees a
    message delivered by a platform not yet known to echo. Should the round fail, each echo is tried
    again alone (with its platform's note), so one bad receipt loses no other."""
    valid = []
    for platform, content in receipts:
        if isinstance(content, dict):
            valid.append((platform, content.get("echo"), content.get("actual_id")))
        else:
            logger.warning("message_id_echo from %s dropped: content is not an object", platform)

    def apply(batch) -> None:
        with transaction.atomic():
            echoed = {p for p, echo, actual in batch if outbound_receipt_apply(platform=p, echo=echo, actual_id=actual)}
            if echoed:
                adapter_platforms_echoed(platforms=echoed)

    batch_or_each(
        valid,
        apply,
        failed=lambda one, exc: logger.exception("message_id_echo from %s not applied", one[0]),
        logger=logger,
        message="a round of %d echoes failed; applying them one by one",
    )


def adapter_frames_store(*, frames: AdapterFrames) -> IngestResult:
    """Store one round of adapter frames: the messages in one transaction, then the receipts."""
    result = inbound_messages_store(items=frames.messages)
    _learn_bot_accounts(result.stored)
    if frames.receipts:
        _receipts_apply(frames.receipts)
    for platform, content in frames.command_responses:
        try:
            command_response_store(platform=platform, content=content)
        except Exception:
            logger.exception("command_response from %s not stored", platform)
    return result


# --- adapter connection records (the console dashboard reads them) --------------------------------


@dataclass
class AdapterOpened:
    """What a new adapter connection starts with."""

    record_id: int
    # The segment types the platform's adapter last said it accepts (empty: not known yet).
    accept_format: list[str]
    # Its adapter has echoed before: the new connection is gated until it echoes (chat.delivery_gate).
    echoes: bool
    # Its adapter was shown never to echo: the connection takes whatever is due. Neither: unproven.
    never_echoes: bool
    # Unproven, and an earlier connection went while a message handed to it awaited its echo.
    after_outage: bool
    # (id, channel) of replaced records held by other processes, whose sockets they should close.
    elsewhere: list[tuple[int, str]]


def adapter_connection_open(*, platform: str, protocol: str, remote: str, channel_name: str = "") -> AdapterOpened:
    """Record a new connection; earlier open records of the platform are closed (it replaced them).
    For a platform that echoes, rows handed to an earlier connection and still awaiting their echo
    become due at once; for one not known to echo or not, they await it no more (chat.delivery_gate)."""
    now = timezone.now()
    with transaction.atomic():
        previous = list(
            AdapterConnection.objects.filter(platform=platform, disconnected_at__isnull=True).values_list(
                "id", "channel_name"
            )
        )
        if previous:
            AdapterConnection.objects.filter(id__in=[p[0] for p in previous]).update(
                disconnected_at=now, close_code=1000
            )
        known = AdapterPlatform.objects.filter(platform=platform).first()
        accept = list(known.accept_format) if known and known.accept_format else []
        if not accept:
            # Learned before AdapterPlatform existed: the platform's last connection that told it.
            last = AdapterConnection.objects.filter(platform=platform).exclude(accept_format=[]).order_by("-id").first()
            accept = list(last.accept_format) if last else []
        record = AdapterConnection.objects.create(
            platform=platform, protocol=protocol, remote=remote[:255], channel_name=channel_name, accept_format=accept
        )
        echoes, never_echoes = bool(known and known.echoes), bool(known and known.never_echoes)
        after_outage = False
        if echoes:
            outbox_platform_reconnected(platform=platform, now=now)
        elif not never_echoes:
            after_outage = outbox_unproven_reconnected(platform=platform) > 0
    elsewhere = [(pk, channel) for pk, channel in previous if channel and channel != channel_name]
    return AdapterOpened(
        record_id=record.id,
        accept_format=accept,
        echoes=echoes,
        never_echoes=never_echoes,
        after_outage=after_outage,
        elsewhere=elsewhere,
    )


def adapter_connection_close(*, record_id: int, close_code: int | None) -> None:
    AdapterConnection.objects.filter(id=record_id, disconnected_at__isnull=True).update(
        disconnected_at=timezone.now(), close_code=close_code
    )


def adapter_connection_set_accept_format(*, record_id: int, platform: str, accept_format: list[str]) -> None:
    """The adapter said which segment types it accepts: kept on its connection record and for its
    platform, so later connections (and restarts) start with it."""
    AdapterConnection.objects.filter(id=record_id).update(accept_format=accept_format)
    updated = AdapterPlatform.objects.filter(platform=platform).update(
        accept_format=accept_format, updated_at=timezone.now()
    )
    if not updated:
        AdapterPlatform.objects.get_or_create(platform=platform, defaults={"accept_format": accept_format})
