"""Proactive messages: messages other systems ask the bot to send (now or at a time) through the API or
the MCP endpoint; which conversation is in api.targets, what is sent in api.content.

Every proactive message is a scheduling.ScheduledMessage (created_via api, its token, its origin),
so it has one lifecycle whether it goes out now or later. "Now" is a row due at once that this process
claims and delivers itself, in the request, with the dispatcher's own claim and finish; later ones are
delivered by the dispatcher in qcluster. Either way the outbound chat Message has source_kind
`proactive`, and the status the API shows is its fate (chat.fate): pending | cancelled before it is
written; then sending → sent (handed to the adapter) → delivered | unconfirmed, or failed.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db.models import QuerySet

from api.access import token_may_reach, token_readable, token_require
from api.content import content_build
from api.errors import ApiError, ApiErrorCode
from api.targets import conversation_as_dict, conversation_resolve, local_time
from chat.fate import NEEDS_ATTENTION, sender_fate, sender_fate_q
from chat.models import ApiScope, ApiToken, Media
from core.config import get_config
from scheduling.dispatcher import deliver_one
from scheduling.error_codes import SchedulingError, SchedulingErrorCode
from scheduling.models import Actor, ScheduledMessage
from scheduling.services import ActedBy, scheduled_message_cancel, scheduled_message_create

Code = ApiErrorCode


class Origin(StrEnum):
    """Who asks for a proactive message; recorded on it."""

    API = "api"
    SCHEDULER = "scheduler"
    CONNECTOR = "connector"
    SYSTEM = "system"
    MCP = "mcp"  # the MCP endpoint's tools (api.mcp) set it; API clients may not


_SCHEDULING_TO_API = {
    SchedulingErrorCode.INVALID_TIME: (Code.INVALID_SEND_AT, "send_at"),
    SchedulingErrorCode.EMPTY_TEXT: (Code.EMPTY_TEXT, "text"),
    SchedulingErrorCode.INVALID_TEXT: (Code.INVALID_CONTENT, "text"),
    SchedulingErrorCode.TEXT_TOO_LONG: (Code.TEXT_TOO_LONG, "text"),
    SchedulingErrorCode.TOO_MANY_PENDING: (Code.TOO_MANY_PENDING, None),
    SchedulingErrorCode.STORAGE_ERROR: (Code.STORAGE_ERROR, None),
    SchedulingErrorCode.NOT_FOUND: (Code.MESSAGE_NOT_FOUND, None),
    SchedulingErrorCode.NOT_PENDING: (Code.NOT_PENDING, None),
}


def _api_error(exc: SchedulingError) -> ApiError:
    code, fld = _SCHEDULING_TO_API.get(exc.code, (Code.VALIDATION_ERROR, None))
    return ApiError(code, exc.message, field=fld)


# --- services -------------------------------------------------------------------------------------


def proactive_message_from(token: ApiToken, origin: str, request: Any) -> ScheduledMessage:
    """`proactive_message_create` for a validated request (the HTTP API's body, the MCP tool's
    arguments): its anchor fields, type, text, format, segments, image and send_at."""
    return proactive_message_create(
        token=token,
        origin=origin,
        conversation_id=request.conversation_id,
        channel_type=request.channel_type,
        channel_thread_id=request.channel_thread_id,
        channel_user_id=request.channel_user_id,
        type=request.type,
        text=request.text,
        format=request.format,
        segments=[s.model_dump() for s in request.segments] if request.segments is not None else None,
        image=request.image.model_dump() if request.image is not None else None,
        send_at=request.send_at,
    )


def proactive_message_create(
    *,
    token: ApiToken,
    origin: str = "api",
    conversation_id: str | None = None,
    channel_type: str | None = None,
    channel_thread_id: str | None = None,
    channel_user_id: str | None = None,
    type: str = "text",
    text: str | None = None,
    format: str = "plain",
    segments: list[dict[str, Any]] | None = None,
    image: dict[str, Any] | None = None,
    send_at: datetime | None = None,
) -> ScheduledMessage:
    """Create a proactive message: sent in this call when send_at is None, else at send_at.

    Call inside a transaction (the API does): on ApiError the caller's savepoint undoes every write,
    including a private conversation created for it. Raises ApiError with a code.
    """
    if origin not in {o.value for o in Origin}:
        raise ApiError(Code.INVALID_CONTENT, f"origin must be one of {', '.join(Origin)}", field="origin")
    anchor = {
        "conversation_id": conversation_id,
        "channel_type": channel_type,
        "channel_thread_id": channel_thread_id,
        "channel_user_id": channel_user_id,
    }
    token_require(token, ApiScope.SEND)
    conversation_resolve(**anchor, check_only=True)
    if channel_type:
        token_may_reach(token, channel=channel_type)  # before a private conversation is created for it
    content = content_build(type=type, text=text, format=format, segments=segments, image=image)
    session = conversation_resolve(**anchor)
    token_may_reach(token, channel=session.platform, conversation_id=session.session_id)
    acted_by = ActedBy(via=Actor.API, token=token, origin=origin)
    note: dict[str, Any] = {"content_type": content.type, "format": content.format}
    if content.media:
        note["media"] = content.media
    try:
        task = scheduled_message_create(
            session=session,
            send_at=send_at,
            message_text=content.message_text,
            segments=content.segments,
            acted_by=acted_by,
            private_only=False,
            max_text_length=get_config().api.max_text_length,
            note=note,
        ).task
    except SchedulingError as exc:
        raise _api_error(exc) from None
    if send_at is None:
        deliver_one(task.pk)
        task.refresh_from_db()
    return task


def proactive_message_cancel(*, token: ApiToken, message_id: str, reason: str = "") -> ScheduledMessage:
    """Cancel a pending proactive message the token may read. Raises ApiError: insufficient_scope,
    message_not_found, not_pending."""
    token_require(token, ApiScope.CANCEL)
    task = proactive_message_get(token=token, message_id=message_id)
    try:
        scheduled_message_cancel(
            acted_by=ActedBy(via=Actor.API, token=token),
            task_ids=[task.pk],
            reason=(reason or "").strip()[:255] or "cancelled via API",
        )
    except SchedulingError as exc:
        raise _api_error(exc) from None
    task.refresh_from_db()
    return task


# --- selectors ------------------------------------------------------------------------------------


def proactive_messages() -> QuerySet[ScheduledMessage]:
    return ScheduledMessage.objects.filter(created_via=Actor.API).select_related("session", "sent_message")


def proactive_message_get(*, token: ApiToken, message_id: str) -> ScheduledMessage:
    """A proactive message the token may read; another token's (without read_all) is not found."""
    task = proactive_messages().filter(token_readable(token), pk=message_id).first()
    if task is None:
        raise ApiError(Code.MESSAGE_NOT_FOUND, f"no proactive message {message_id!r}")
    return task


def proactive_messages_list(
    *,
    token: ApiToken,
    status: str | None = None,
    conversation_id: str | None = None,
    origin: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    send_after: datetime | None = None,
    send_before: datetime | None = None,
) -> QuerySet[ScheduledMessage]:
    qs = proactive_messages().filter(token_readable(token))
    if status:
        qs = qs.filter(sender_fate_q("sent_message", "status", [status]))
    if conversation_id:
        qs = qs.filter(session__session_id=conversation_id)
    if origin:
        qs = qs.filter(origin=origin)
    if created_after:
        qs = qs.filter(created_at__gte=created_after)
    if created_before:
        qs = qs.filter(created_at__lt=created_before)
    if send_after:
        qs = qs.filter(send_at__gte=send_after)
    if send_before:
        qs = qs.filter(send_at__lt=send_before)
    return qs.order_by("-created_at", "-pk")


# --- public shapes --------------------------------------------------------------------------------


def _public_segment(seg: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
    data = seg.get("data")
    if seg.get("type") == "image" and isinstance(data, dict):
        # A client sees which image it was, not its bytes again.
        return {"type": "image", "sha256": data.get("media"), "size": sizes.get(data.get("media"))}
    return {"type": seg.get("type"), "data": data}


def _created(task: ScheduledMessage) -> dict[str, Any]:
    return next((e for e in task.history if e.get("event") == "created"), {})


def image_sizes(tasks: list[ScheduledMessage]) -> dict[str, int]:
    """The stored sizes of the images these messages carry: one query for a whole page."""
    media = {sha for task in tasks for sha in _created(task).get("media") or []}
    return dict(Media.objects.filter(sha256__in=media, kind="image").values_list("sha256", "size")) if media else {}


def proactive_messages_as_dicts(tasks: list[ScheduledMessage]) -> list[dict[str, Any]]:
    sizes = image_sizes(tasks)
    return [proactive_message_as_dict(task, sizes=sizes) for task in tasks]


def proactive_message_as_dict(task: ScheduledMessage, *, sizes: dict[str, int] | None = None) -> dict[str, Any]:
    """The API's view of a proactive message: its fate and the delivery of what it sent."""
    created = _created(task)
    if sizes is None:
        sizes = image_sizes([task])
    message = task.sent_message
    fate = sender_fate(task.status, message)
    failure = task.last_error or (message.delivery_error if message is not None and fate in NEEDS_ATTENTION else "")
    delivery = None
    if message is not None:
        delivery = {
            "message_id": str(message.uid),
            "status": message.delivery_status,
            "sent_at": local_time(message.sent_at),
            "delivered_at": local_time(message.delivered_at),
            "platform_message_id": message.platform_message_id or None,
            "error": message.delivery_error or None,
        }
    return {
        "id": task.pk,
        "status": str(fate),
        "origin": task.origin,
        "conversation": conversation_as_dict(task.session),
        "content": {
            "type": created.get("content_type", "text"),
            "format": created.get("format", "plain"),
            "text": task.message_text,
            "segments": [_public_segment(s, sizes) for s in task.segments],
        },
        "send_at": local_time(task.send_at),
        "created_at": local_time(task.created_at),
        "sent_at": local_time(task.sent_at),
        "cancelled_at": local_time(task.cancelled_at),
        "cancel_reason": task.cancel_reason or None,
        "failure_reason": failure or None,
        "attempts": task.attempts,
        "delivery": delivery,
    }
