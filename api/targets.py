"""Which conversation an API request means (its target), and the conversations a token may list.

A request names its conversation by exactly one anchor:
  * `conversation_id`: our ChatSession.session_id (globally unique); unknown → conversation_not_found;
  * `channel_type` + `channel_thread_id`: a group chat on that platform; unknown → thread_not_found
    (the bot cannot start a group chat, it must already know the group);
  * `channel_type` + `channel_user_id`: a person's private chat, created when it does not exist yet.
No anchor → missing_anchor; two anchors (or `channel_type` beside `conversation_id`) → conflicting_anchor.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from api.access import token_conversations, token_require
from api.errors import ApiError, ApiErrorCode
from chat.models import ApiScope, ApiToken, ChatSession, ChatType, make_session_id
from chat.services import session_get_or_create
from core.config import get_config

Code = ApiErrorCode


def _anchor(
    *,
    conversation_id: str | None,
    channel_type: str | None,
    channel_thread_id: str | None,
    channel_user_id: str | None,
) -> str:
    """The one anchor a request gives, its shape checked; raises ApiError by the rules above."""
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
    elif not channel_type:
        raise ApiError(
            Code.MISSING_CHANNEL_TYPE, f"{anchors[0]} needs channel_type (the platform, e.g. qq)", field="channel_type"
        )
    return anchors[0]


def conversation_resolve(
    *,
    conversation_id: str | None = None,
    channel_type: str | None = None,
    channel_thread_id: str | None = None,
    channel_user_id: str | None = None,
    check_only: bool = False,
) -> ChatSession | None:
    """The conversation a request is anchored to, by the rules in this module's docstring.

    With check_only the anchor's shape is validated and nothing is looked up or created.
    """
    anchor = _anchor(
        conversation_id=conversation_id,
        channel_type=channel_type,
        channel_thread_id=channel_thread_id,
        channel_user_id=channel_user_id,
    )
    if check_only:
        return None
    if anchor == "conversation_id":
        session = ChatSession.objects.filter(session_id=conversation_id).first()
        if session is None:
            raise ApiError(Code.CONVERSATION_NOT_FOUND, f"no conversation {conversation_id!r}", field="conversation_id")
        return session
    if anchor == "channel_thread_id":
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


def local_time(value: datetime | None) -> datetime | None:
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
        "last_active_at": local_time(session.last_active_at),
    }
