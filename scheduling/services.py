"""Every write to scheduled messages. The planner tools, the admin, the API and the dispatcher call these."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from chat.fate import RESENDABLE, sender_fate
from chat.models import ApiToken, ChatSession
from chat.services import messages_resend
from core.config import format_instant, get_config
from core.text import is_blank, text_problem
from scheduling.error_codes import SchedulingError, SchedulingErrorCode
from scheduling.models import Actor, ScheduledMessage, ScheduledStatus
from scheduling.timespec import TimeSpecError, parse_instant, parse_spoken_time
from scheduling.wakeups import dispatchers_wake_on_commit

logger = logging.getLogger(__name__)

Code = SchedulingErrorCode


@dataclass(frozen=True)
class ActedBy:
    """Who is acting: the planner (with its tool call id), an operator, the API, or the system."""

    via: str
    tool_call_id: str = ""
    user: Any = None
    token: ApiToken | None = None
    origin: str = ""

    def describe(self) -> str:
        if self.via == Actor.TOOL:
            return f"tool:{self.tool_call_id}"
        if self.via == Actor.OPERATOR and self.user is not None:
            return f"operator:{self.user.get_username()}"
        if self.via == Actor.API and self.token is not None:
            return f"api:{self.token.name}"
        return str(self.via)


SYSTEM = ActedBy(via=Actor.SYSTEM)


def _event(task: ScheduledMessage, event: str, by: ActedBy, now: datetime, **details: Any) -> None:
    task.history = [*task.history, {"at": now.isoformat(), "event": event, "by": by.describe(), **details}]


def resolve_send_at(value: str | datetime, *, now: datetime | None = None) -> datetime:
    """Validate a requested send time: parseable, in the future, within the horizon."""
    cfg = get_config()
    now = now or timezone.now()
    if isinstance(value, datetime):
        if timezone.is_naive(value):
            raise SchedulingError(Code.INVALID_TIME, "send_at must carry a time zone")
        send_at = value
    else:
        try:
            send_at = parse_instant(value, cfg.tzinfo)
        except TimeSpecError as exc:
            raise SchedulingError(Code.INVALID_TIME, str(exc)) from None
    if send_at <= now:
        raise SchedulingError(
            Code.INVALID_TIME,
            f"send_at {format_instant(send_at, cfg.tzinfo)} is in the past (now is {format_instant(now, cfg.tzinfo)})",
        )
    horizon = timedelta(days=cfg.scheduling.horizon_days)
    if send_at - now > horizon:
        raise SchedulingError(Code.INVALID_TIME, f"send_at is more than {cfg.scheduling.horizon_days} days ahead")
    return send_at


def resolve_typed_send_at(text: str, *, now: datetime | None = None) -> datetime:
    """A send time as a person types it ("明天早上8点", "in 2 hours", ISO 8601 with or without an offset,
    read in the bot's time zone) through the bot's one time parser, validated as resolve_send_at does."""
    now = now or timezone.now()
    try:
        when = parse_spoken_time(text, get_config().tzinfo, now=now)
    except TimeSpecError as exc:
        raise SchedulingError(Code.INVALID_TIME, str(exc)) from None
    return resolve_send_at(when, now=now)


def validate_text(text: str, *, has_segments: bool = False, max_length: int | None = None) -> str:
    """The message text, stripped; refused when empty (without other content) or over the limit."""
    max_length = max_length or get_config().scheduling.max_text_length
    text = (text or "").strip()
    if problem := text_problem(text):
        raise SchedulingError(Code.INVALID_TEXT, f"message_text {problem}")
    if is_blank(text):
        if not has_segments:
            raise SchedulingError(Code.EMPTY_TEXT, "message_text is empty")
        text = ""
    if len(text) > max_length:
        raise SchedulingError(Code.TEXT_TOO_LONG, f"message_text has {len(text)} characters; the limit is {max_length}")
    return text


@dataclass
class CreateResult:
    task: ScheduledMessage
    cancelled_ids: list[str] = field(default_factory=list)


def scheduled_message_create(
    *,
    session: ChatSession,
    send_at: str | datetime | None,
    message_text: str,
    acted_by: ActedBy,
    replace_existing: bool = False,
    segments: list[dict[str, Any]] | None = None,
    private_only: bool = True,
    max_text_length: int | None = None,
    note: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> CreateResult:
    """Schedule a message for a session. With replace_existing, the session's pending ones are
    cancelled in the same transaction. Raises SchedulingError with a code on refusal.
    send_at None means due at once (the API's "send now": it then delivers the row itself with
    scheduling.dispatcher.deliver_one). `note` adds facts to the "created" history event (the API
    records its content type and text format there)."""
    cfg = get_config().scheduling
    now = now or timezone.now()
    if private_only and not session.is_private:
        raise SchedulingError(Code.NOT_PRIVATE_CHAT, "scheduled messages are for private chats only")
    text = validate_text(message_text, has_segments=bool(segments), max_length=max_text_length)
    when = now if send_at is None else resolve_send_at(send_at, now=now)
    try:
        with transaction.atomic():
            pending = ScheduledMessage.objects.filter(session=session, status=ScheduledStatus.PENDING)
            cancelled_ids: list[str] = []
            if replace_existing:
                cancelled_ids = _cancel(pending, by=acted_by, reason="replaced", now=now)
            elif pending.count() >= cfg.max_pending_per_session:
                raise SchedulingError(
                    Code.TOO_MANY_PENDING,
                    f"this chat already has {cfg.max_pending_per_session} pending scheduled messages; "
                    "cancel one or use replace_existing",
                )
            task = ScheduledMessage(
                session=session,
                chat_type=session.chat_type,
                message_text=text,
                segments=list(segments or []),
                send_at=when,
                due_at=when,
                replace_existing=replace_existing,
                created_via=acted_by.via,
                created_by_tool_call_id=acted_by.tool_call_id,
                created_by_user=acted_by.user,
                created_by_token=acted_by.token,
                origin=acted_by.origin,
            )
            _event(task, "created", acted_by, now, send_at=when.isoformat(), **(note or {}))
            task.save(force_insert=True)
            if send_at is not None:  # "send now" is delivered by its caller (deliver_one)
                dispatchers_wake_on_commit()
    except SchedulingError:
        raise
    except DatabaseError as exc:
        logger.exception("could not store scheduled message for %s", session.session_id)
        raise SchedulingError(Code.STORAGE_ERROR, f"the message could not be stored: {exc}") from exc
    return CreateResult(task=task, cancelled_ids=cancelled_ids)


def _cancel(queryset, *, by: ActedBy, reason: str, now: datetime) -> list[str]:
    """Cancel the pending rows of a queryset; returns the ids actually cancelled (conditional update)."""
    cancelled: list[str] = []
    for task in queryset.filter(status=ScheduledStatus.PENDING):
        _event(task, "cancelled", by, now, reason=reason)
        updated = ScheduledMessage.objects.filter(pk=task.pk, status=ScheduledStatus.PENDING).update(
            status=ScheduledStatus.CANCELLED,
            cancelled_at=now,
            cancelled_via=by.via,
            cancelled_by_tool_call_id=by.tool_call_id,
            cancelled_by_user=by.user,
            cancel_reason=reason[:255],
            history=task.history,
            updated_at=now,
        )
        if updated:
            cancelled.append(task.pk)
    return cancelled


def scheduled_message_cancel(
    *,
    acted_by: ActedBy,
    session: ChatSession | None = None,
    task_ids: list[str] | None = None,
    reason: str = "",
    now: datetime | None = None,
) -> list[str]:
    """Cancel pending messages: the given ids (within `session` when given), or all of `session`.

    Only pending rows change; a message already claimed for sending is not touched.
    Raises NOT_FOUND for an id that does not exist (in that session) and NOT_PENDING for one that is
    no longer pending.
    """
    now = now or timezone.now()
    qs = ScheduledMessage.objects.all()
    if session is not None:
        qs = qs.filter(session=session)
    with transaction.atomic():
        if task_ids is not None:
            found = {t.pk: t.status for t in qs.filter(pk__in=task_ids)}
            for task_id in task_ids:
                if task_id not in found:
                    raise SchedulingError(Code.NOT_FOUND, f"no scheduled message {task_id!r} in this chat")
                if found[task_id] != ScheduledStatus.PENDING:
                    raise SchedulingError(
                        Code.NOT_PENDING, f"scheduled message {task_id} is {found[task_id]}, not pending"
                    )
            qs = qs.filter(pk__in=task_ids)
        elif session is None:
            raise ValueError("cancel needs a session or task ids")
        return _cancel(qs, by=acted_by, reason=reason or "cancelled", now=now)


def scheduled_message_reschedule(
    *, task_id: str, send_at: str | datetime, acted_by: ActedBy, now: datetime | None = None
) -> ScheduledMessage:
    """Move a pending message to a new (future) time."""
    now = now or timezone.now()
    when = resolve_send_at(send_at, now=now)
    with transaction.atomic():
        task = _pending_for_update(task_id)
        _event(task, "rescheduled", acted_by, now, old=task.send_at.isoformat(), new=when.isoformat())
        task.send_at = when
        task.due_at = when
        task.rescheduled_at = now
        task.rescheduled_by_user = acted_by.user
        task.save(update_fields=["send_at", "due_at", "rescheduled_at", "rescheduled_by_user", "history", "updated_at"])
        dispatchers_wake_on_commit()
    return task


def scheduled_message_edit_text(
    *, task_id: str, message_text: str, acted_by: ActedBy, now: datetime | None = None
) -> ScheduledMessage:
    """Change the text of a pending message."""
    now = now or timezone.now()
    text = validate_text(message_text)
    with transaction.atomic():
        task = _pending_for_update(task_id)
        _event(task, "edited", acted_by, now, old_text=task.message_text)
        task.message_text = text
        task.save(update_fields=["message_text", "history", "updated_at"])
    return task


def scheduled_message_send_now(*, task_id: str, acted_by: ActedBy, now: datetime | None = None) -> ScheduledMessage:
    """Make a pending message due at once; the dispatcher sends it on its next round."""
    now = now or timezone.now()
    with transaction.atomic():
        task = _pending_for_update(task_id)
        _event(task, "send_now", acted_by, now)
        task.due_at = now
        task.save(update_fields=["due_at", "history", "updated_at"])
        dispatchers_wake_on_commit()
    return task


def scheduled_message_retry(*, task_id: str, acted_by: ActedBy, now: datetime | None = None) -> ScheduledMessage:
    """Put a failed message back to pending, due now, with a fresh attempt budget."""
    now = now or timezone.now()
    with transaction.atomic():
        task = ScheduledMessage.objects.filter(pk=task_id).first()
        if task is None:
            raise SchedulingError(Code.NOT_FOUND, f"no scheduled message {task_id!r}")
        if task.status != ScheduledStatus.FAILED:
            raise SchedulingError(Code.NOT_PENDING, f"scheduled message {task_id} is {task.status}, not failed")
        _event(task, "retried", acted_by, now, previous_error=task.last_error)
        updated = ScheduledMessage.objects.filter(pk=task_id, status=ScheduledStatus.FAILED).update(
            status=ScheduledStatus.PENDING, due_at=now, attempts=0, last_error="", history=task.history, updated_at=now
        )
        if not updated:
            raise SchedulingError(Code.NOT_PENDING, f"scheduled message {task_id} changed meanwhile")
        dispatchers_wake_on_commit()
        task.refresh_from_db()
    return task


def scheduled_message_resend(*, task_id: str, acted_by: ActedBy, now: datetime | None = None) -> ScheduledMessage:
    """Put a sent message's outbound message back in the outbox when its delivery came to nothing
    (unconfirmed or failed), through chat's resend; recorded in the task's history."""
    now = now or timezone.now()
    with transaction.atomic():
        task = ScheduledMessage.objects.select_related("sent_message").filter(pk=task_id).first()
        if task is None:
            raise SchedulingError(Code.NOT_FOUND, f"no scheduled message {task_id!r}")
        message = task.sent_message
        if message is None or message.delivery_status not in RESENDABLE:
            fate = sender_fate(task.status, message)
            raise SchedulingError(
                Code.NOT_RESENDABLE, f"scheduled message {task_id} is {fate}: only unconfirmed or failed ones resend"
            )
        previous, error = message.delivery_status, message.delivery_error
        if not messages_resend(message_ids=[message.pk], by=acted_by.describe(), now=now):
            raise SchedulingError(Code.NOT_RESENDABLE, f"scheduled message {task_id} changed meanwhile")
        _event(task, "resent", acted_by, now, previous=previous, error=error)
        ScheduledMessage.objects.filter(pk=task_id).update(history=task.history, updated_at=now)
        task.refresh_from_db()
    return task


def _pending_for_update(task_id: str) -> ScheduledMessage:
    task = ScheduledMessage.objects.select_for_update().filter(pk=task_id).first()
    if task is None:
        raise SchedulingError(Code.NOT_FOUND, f"no scheduled message {task_id!r}")
    if task.status != ScheduledStatus.PENDING:
        raise SchedulingError(Code.NOT_PENDING, f"scheduled message {task_id} is {task.status}, not pending")
    return task


# --- selectors ------------------------------------------------------------------------------------


def scheduled_messages_pending(*, session: ChatSession) -> list[ScheduledMessage]:
    return list(ScheduledMessage.objects.filter(session=session, status=ScheduledStatus.PENDING).order_by("send_at"))


def scheduled_message_as_dict(task: ScheduledMessage) -> dict[str, Any]:
    """The public shape of a scheduled message (tool results, API)."""
    tz = get_config().tzinfo
    return {
        "task_id": task.pk,
        "session_id": task.session.session_id,
        "send_at": format_instant(task.send_at, tz),
        "message_text": task.message_text,
        "status": task.status,
        "replace_existing": task.replace_existing,
    }
