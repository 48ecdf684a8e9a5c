"""Proactive messages: messages other systems ask the bot to send (now or at a time) through the API.

Routing: a request names its conversation by exactly one anchor:
  * `conversation_id`: our ChatSession.session_id (globally unique); unknown → conversation_not_found;
  * `channel_type` + `channel_thread_id`: a group chat on that platform; unknown → thread_not_found
    (the bot cannot start a group chat, it must already know the group);
  * `channel_type` + `channel_user_id`: a person's private chat, created when it does not exist yet.
No anchor → missing_anchor; two anchors (or `channel_type` beside `conversation_id`) → conflicting_anchor.

Every proactive message is a scheduling.ScheduledMessage (created_via api, its token, its origin),
so it has one lifecycle whether it goes out now or later. "Now" is a row due at once that this process
claims and delivers itself, in the request, with the dispatcher's own claim and finish; later ones are
delivered by the dispatcher in qcluster. Either way the outbound chat Message has source_kind
`proactive`, and the status the API shows is its fate (chat.fate): pending | cancelled before it is
written; then sending → sent (handed to the adapter) → delivered | unconfirmed, or failed.

Content types:
  * `text`: plain or markdown. QQ renders no markdown, so markdown is sent as written (the adapter
    has no markdown segment) and the format is recorded on the message.
  * `image`: base64 (stored in the media store, sent as an `image` segment) or an http(s) URL, sent
    as an `imageurl` segment for the adapter to fetch: this server never fetches URLs (no outbound
    internet is assumed, and fetching arbitrary URLs would be a request-forgery hole). Optional
    caption `text`, sent before the image.
  * `rich_text`: a list of segments: text, image (base64 or URL) and mention. The QQ adapter drops
    `at` segments, so a mention is sent as the text "@name" (name defaults to the user id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from django.db.models import QuerySet

from api.access import (
    token_conversations,
    token_may_reach,
    token_readable,
    token_require,
)
from api.errors import ApiError, ApiErrorCode
from chat.fate import NEEDS_ATTENTION, sender_fate, sender_fate_q
from chat.media import MediaError, decode_base64, media_store, sniff_mime
from chat.models import ApiScope, ApiToken, ChatSession, ChatType, Media, make_session_id
from chat.services import session_get_or_create
from core.config import get_config
from core.text import is_blank
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
    MCP = "mcp"  # the MCP endpoint's tools (scheduling.mcp) set it; API clients may not


CONTENT_TYPES = ("text", "rich_text", "image")
TEXT_FORMATS = ("plain", "markdown")
SEGMENT_TYPES = ("text", "image", "mention")
MAX_SEGMENTS = 50
MAX_URL_LENGTH = 2048

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


# --- routing --------------------------------------------------------------------------------------


def conversation_resolve(
    *,
    conversation_id: str | None = None,
    channel_type: str | None = None,
    channel_thread_id: str | None = None,
    channel_user_id: str | None = None,
    check_only: bool = False,
) -> ChatSession | None:
    """The conversation a request is anchored to, by the routing rules in this module's docstring.

    With check_only the anchor's shape is validated and nothing is looked up or created.
    """
    anchors = [
        name
        for name, value in (
            ("conversation_id", conversation_id),
            ("channel_thread_id", channel_thread_id),
            ("channel_user_id", channel_user_id),
        )
        if value not in (None, "")
    ]
    if len(anchors) > 1:
        raise ApiError(
            Code.CONFLICTING_ANCHOR,
            f"give exactly one anchor; got {' and '.join(anchors)}",
            field=anchors[1],
        )
    if not anchors:
        raise ApiError(
            Code.MISSING_ANCHOR,
            "name the conversation: conversation_id, or channel_type with channel_thread_id or channel_user_id",
        )
    if anchors[0] == "conversation_id":
        if channel_type:
            raise ApiError(
                Code.CONFLICTING_ANCHOR,
                "conversation_id names the conversation on its own; do not combine it with channel_type",
                field="channel_type",
            )
        if check_only:
            return None
        session = ChatSession.objects.filter(session_id=conversation_id).first()
        if session is None:
            raise ApiError(Code.CONVERSATION_NOT_FOUND, f"no conversation {conversation_id!r}", field="conversation_id")
        return session
    if not channel_type:
        raise ApiError(
            Code.MISSING_CHANNEL_TYPE, f"{anchors[0]} needs channel_type (the platform, e.g. qq)", field="channel_type"
        )
    if check_only:
        return None
    if anchors[0] == "channel_thread_id":
        session = ChatSession.objects.filter(
            session_id=make_session_id(channel_type, ChatType.GROUP, str(channel_thread_id))
        ).first()
        if session is None:
            raise ApiError(
                Code.THREAD_NOT_FOUND,
                f"the bot knows no group {channel_thread_id!r} on {channel_type!r}",
                field="channel_thread_id",
            )
        return session
    return session_get_or_create(platform=channel_type, chat_type=ChatType.PRIVATE, user_id=str(channel_user_id))


# --- content --------------------------------------------------------------------------------------


@dataclass
class Content:
    """A request's content as the send service needs it, plus what to record about it."""

    type: str
    format: str
    message_text: str
    segments: list[dict[str, Any]] = field(default_factory=list)
    media: list[str] = field(default_factory=list)


def _image_segment(*, base64_data: str | None, url: str | None, fld: str, content: Content) -> dict[str, Any]:
    given = [name for name, value in (("base64", base64_data), ("url", url)) if value]
    if len(given) != 1:
        raise ApiError(Code.INVALID_IMAGE, "give the image as exactly one of base64 or url", field=fld)
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or len(url) > MAX_URL_LENGTH:
            raise ApiError(
                Code.INVALID_IMAGE, f"url must be an http(s) URL of at most {MAX_URL_LENGTH} characters", field=fld
            )
        return {"type": "imageurl", "data": url}
    limit = get_config().api.max_image_bytes
    # Reject by the encoded size first: decoding a huge payload only to refuse it wastes memory.
    if len(base64_data) > limit * 4 // 3 + 8:
        raise ApiError(Code.IMAGE_TOO_LARGE, f"the image is larger than {limit} bytes", field=f"{fld}.base64")
    try:
        data = decode_base64(base64_data.strip())
    except MediaError as exc:
        raise ApiError(Code.INVALID_IMAGE, f"image base64: {exc}", field=f"{fld}.base64") from None
    if len(data) > limit:
        raise ApiError(Code.IMAGE_TOO_LARGE, f"the image is larger than {limit} bytes", field=f"{fld}.base64")
    if not sniff_mime(data).startswith("image/"):
        raise ApiError(Code.INVALID_IMAGE, "the data is not a PNG, JPEG, GIF or WebP image", field=f"{fld}.base64")
    media = media_store(data=data, kind="image")
    content.media.append(media.sha256)
    # A reference to the stored media, as inbound media is kept: the outbox (chat.outbox) puts the
    # bytes on the wire as the bare base64 adapters expect, and rows stay small.
    return {"type": "image", "data": {"media": media.sha256}}


def _reject_extra(fld: str, given: Any, *, for_type: str) -> None:
    if given not in (None, "", []):
        raise ApiError(Code.INVALID_CONTENT, f"{fld} is not used with type {for_type!r}", field=fld)


def content_build(
    *,
    type: str,
    text: str | None = None,
    format: str = "plain",
    segments: list[dict[str, Any]] | None = None,
    image: dict[str, Any] | None = None,
) -> Content:
    """Validate a request's content and turn it into maim_message segments (media stored)."""
    max_len = get_config().api.max_text_length
    if type not in CONTENT_TYPES:
        raise ApiError(Code.INVALID_CONTENT, f"type must be one of {', '.join(CONTENT_TYPES)}", field="type")
    if format not in TEXT_FORMATS:
        raise ApiError(Code.INVALID_CONTENT, f"format must be one of {', '.join(TEXT_FORMATS)}", field="format")
    if format != "plain" and type != "text":
        raise ApiError(Code.INVALID_CONTENT, "format applies to type 'text' only", field="format")
    text = (text or "").strip()
    if len(text) > max_len:
        raise ApiError(Code.TEXT_TOO_LONG, f"text has {len(text)} characters; the limit is {max_len}", field="text")
    content = Content(type=type, format=format, message_text=text)

    if type == "text":
        _reject_extra("segments", segments, for_type=type)
        _reject_extra("image", image, for_type=type)
        if is_blank(text):
            raise ApiError(Code.EMPTY_TEXT, "text is empty", field="text")
        return content

    if type == "image":
        _reject_extra("segments", segments, for_type=type)
        if not image:
            raise ApiError(Code.INVALID_CONTENT, "type 'image' needs image", field="image")
        seg = _image_segment(base64_data=image.get("base64"), url=image.get("url"), fld="image", content=content)
        content.segments = ([{"type": "text", "data": text}] if text else []) + [seg]
        return content

    _reject_extra("text", text, for_type=type)
    _reject_extra("image", image, for_type=type)
    if not segments:
        raise ApiError(Code.INVALID_CONTENT, "type 'rich_text' needs a non-empty segments list", field="segments")
    if len(segments) > MAX_SEGMENTS:
        raise ApiError(Code.INVALID_CONTENT, f"at most {MAX_SEGMENTS} segments", field="segments")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, seg in enumerate(segments):
        fld = f"segments[{i}]"
        kind = seg.get("type")
        if kind == "text":
            value = seg.get("text") or ""
            if is_blank(value):
                raise ApiError(Code.EMPTY_TEXT, "a text segment needs text", field=f"{fld}.text")
            out.append({"type": "text", "data": value})
            texts.append(value)
        elif kind == "mention":
            user_id = str(seg.get("user_id") or "").strip()
            if not user_id:
                raise ApiError(Code.INVALID_CONTENT, "a mention needs user_id", field=f"{fld}.user_id")
            value = f"@{(seg.get('name') or '').strip() or user_id} "
            out.append({"type": "text", "data": value})
            texts.append(value)
        elif kind == "image":
            out.append(_image_segment(base64_data=seg.get("base64"), url=seg.get("url"), fld=fld, content=content))
        else:
            raise ApiError(
                Code.INVALID_CONTENT, f"segment type must be one of {', '.join(SEGMENT_TYPES)}", field=f"{fld}.type"
            )
    joined = "".join(texts).strip()
    if len(joined) > max_len:
        raise ApiError(
            Code.TEXT_TOO_LONG,
            f"the segments' text has {len(joined)} characters; the limit is {max_len}",
            field="segments",
        )
    content.segments = out
    content.message_text = joined
    return content


# --- services -------------------------------------------------------------------------------------


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


def conversations_list(
    *,
    token: ApiToken,
    channel_type: str | None = None,
    chat_type: str | None = None,
    channel_user_id: str | None = None,
    channel_thread_id: str | None = None,
) -> QuerySet[ChatSession]:
    token_require(token, ApiScope.SEND)  # finding a conversation is part of sending to it
    qs = ChatSession.objects.filter(token_conversations(token))
    if channel_type:
        qs = qs.filter(platform=channel_type)
    if chat_type:
        qs = qs.filter(chat_type=chat_type)
    if channel_user_id:
        qs = qs.filter(chat_type=ChatType.PRIVATE, user_id=channel_user_id)
    if channel_thread_id:
        qs = qs.filter(chat_type=ChatType.GROUP, group_id=channel_thread_id)
    return qs.order_by("-last_active_at", "-pk")


# --- public shapes --------------------------------------------------------------------------------


def _local(value: datetime | None) -> datetime | None:
    return value.astimezone(get_config().tzinfo) if value is not None else None


def conversation_as_dict(session: ChatSession) -> dict[str, Any]:
    private = session.chat_type == ChatType.PRIVATE
    return {
        "conversation_id": session.session_id,
        "channel_type": session.platform,
        "chat_type": session.chat_type,
        "channel_thread_id": None if private else session.group_id,
        "channel_user_id": session.user_id if private else None,
        "name": (session.user_nickname or session.user_id) if private else (session.group_name or session.group_id),
        "last_active_at": _local(session.last_active_at),
    }


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
            "sent_at": _local(message.sent_at),
            "delivered_at": _local(message.delivered_at),
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
        "send_at": _local(task.send_at),
        "created_at": _local(task.created_at),
        "sent_at": _local(task.sent_at),
        "cancelled_at": _local(task.cancelled_at),
        "cancel_reason": task.cancel_reason or None,
        "failure_reason": failure or None,
        "attempts": task.attempts,
        "delivery": delivery,
    }
