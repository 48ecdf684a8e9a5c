"""chat.*: the chats (streams) plugins see. A stream id is our ChatSession.session_id, derived from
platform, chat type and user or group id, so the same chat has the same id across restarts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugins.capabilities.common import MAX_ID, db, stream

if TYPE_CHECKING:
    from plugins.records import PluginRecord

MAX_STREAMS = 10_000  # streams one listing returns
MAX_PLATFORM = 64


def _platform(args: dict[str, Any]) -> str:
    return str(args.get("platform") or "qq").strip()[:MAX_PLATFORM]


async def _streams(args: dict[str, Any], chat_type: str | None) -> dict[str, Any]:
    from chat.models import ChatSession

    platform = _platform(args)

    def read() -> dict[str, Any]:
        rows = ChatSession.objects.order_by("pk")
        if platform != "all_platforms":
            rows = rows.filter(platform=platform)
        if chat_type:
            rows = rows.filter(chat_type=chat_type)
        return {"success": True, "streams": [stream(s) for s in rows[:MAX_STREAMS]]}

    return await db(read)


async def get_all_streams(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _streams(args, None)


async def get_group_streams(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _streams(args, "group")


async def get_private_streams(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _streams(args, "private")


async def _one_stream(args: dict[str, Any], chat_type: str, key: str) -> dict[str, Any]:
    from chat.models import ChatSession, make_session_id

    target = str(args.get(key) or "").strip()
    if not target or len(target) > MAX_ID:
        return {"success": False, "error": f"{key} is required (at most {MAX_ID} characters)"}
    session_id = make_session_id(_platform(args), chat_type, target)

    def read() -> dict[str, Any]:
        session = ChatSession.objects.filter(session_id=session_id).first()
        return {"success": True, "stream": stream(session) if session else None}

    return await db(read)


async def get_stream_by_group_id(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _one_stream(args, "group", "group_id")


async def get_stream_by_user_id(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _one_stream(args, "private", "user_id")


def _chat_type(args: dict[str, Any]) -> str:
    # As MaiBot: an explicit chat_type (or type), else group when a group id is given.
    raw = str(args.get("chat_type") or args.get("type") or "").strip().lower()
    if raw in ("group", "private"):
        return raw
    return "group" if str(args.get("group_id") or "").strip() else "private"


async def open_session(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """Open (or create) the chat with a platform target, so a plugin can write first. Returns the stream
    flat and under `stream`, with `created`, as MaiBot does; account_id and scope are not used (one
    account per platform here)."""
    from chat.models import ChatSession, make_session_id
    from chat.services import session_get_or_create

    platform = _platform(args)
    chat_type = _chat_type(args)
    user_id = str(args.get("user_id") or "").strip()
    group_id = str(args.get("group_id") or "").strip()
    target = group_id if chat_type == "group" else user_id
    if not platform:
        return {"success": False, "error": "chat.open_session needs platform"}
    if not target:
        need = "group_id" if chat_type == "group" else "user_id"
        return {"success": False, "error": f"a {chat_type} chat needs {need}"}
    if len(target) > MAX_ID or any(ord(c) < 32 for c in target):
        return {"success": False, "error": f"{'group_id' if chat_type == 'group' else 'user_id'} is not a valid id"}

    def open_() -> dict[str, Any]:
        existed = ChatSession.objects.filter(session_id=make_session_id(platform, chat_type, target)).exists()
        session = session_get_or_create(
            platform=platform,
            chat_type=chat_type,
            user_id=user_id if chat_type == "private" else "",
            group_id=group_id if chat_type == "group" else "",
        )
        serialized = stream(session)
        return {"success": True, "created": not existed, "stream": serialized, **serialized}

    return await db(open_)
