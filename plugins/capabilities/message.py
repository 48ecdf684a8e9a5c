"""message.*: reading stored messages (recent, by id, by time in a chat), in the shape MaiBot's host
serializes them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from plugins.capabilities.common import db, message, session_of, stream_id_of

if TYPE_CHECKING:
    from plugins.records import PluginRecord

MAX_RECENT = 200  # messages one get_recent may return
MAX_BY_TIME = 1000  # messages one get_by_time_in_chat may return (its limit 0, "all", means this many)


async def get_recent(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    stream_id = stream_id_of(args, "chat_id", "stream_id")
    try:
        limit = int(args.get("limit", 10))
    except (TypeError, ValueError):
        return {"success": False, "error": "limit must be an integer"}
    limit = max(1, min(limit, MAX_RECENT))
    if not stream_id:
        return {"success": False, "error": "message.get_recent needs chat_id"}

    def read() -> dict[str, Any]:
        session = session_of(stream_id)
        if session is None:
            return {"success": False, "error": f"there is no chat with stream_id {stream_id}"}
        rows = session.messages.order_by("-time", "-pk")
        if args.get("filter_mai"):
            rows = rows.exclude(direction="out")
        rows = list(rows[:limit])
        return {"success": True, "messages": [message(m, session) for m in reversed(rows)]}

    return await db(read)


async def get_by_id(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.models import Message

    message_id = str(args.get("message_id") or args.get("msg_id") or "").strip()[:128]
    stream_id = stream_id_of(args, "chat_id", "stream_id")
    if not message_id:
        return {"success": False, "error": "message.get_by_id needs message_id"}

    def read() -> dict[str, Any]:
        rows = Message.objects.select_related("session")
        if stream_id:
            rows = rows.filter(session__session_id=stream_id)
        found = rows.filter(platform_message_id=message_id).order_by("-pk").first()
        if found is None:
            try:
                found = rows.filter(uid=uuid.UUID(message_id)).first()
            except ValueError:
                found = None
        return {"success": True, "message": message(found, found.session) if found else None}

    return await db(read)


def instant(value: Any, name: str) -> datetime:
    """A time bound as plugins pass it: a Unix timestamp (number or numeric string, MaiBot's form) or
    an ISO 8601 instant with an offset."""
    if isinstance(value, bool) or value is None or value == "":
        raise ValueError(f"{name} is required (a Unix timestamp or an ISO 8601 time with offset)")
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        pass
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"{name} is neither a Unix timestamp nor an ISO 8601 time: {str(value)[:40]!r}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{name} needs a UTC offset (e.g. 2026-01-01T12:00:00+00:00)")
    return parsed


async def get_by_time_in_chat(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """Messages of one chat with start_time <= time <= end_time, oldest first; limit > 0 keeps the
    latest (limit_mode "latest", the default) or the earliest ("earliest") that many, as in MaiBot;
    filter_mai leaves the bot's own messages out."""
    stream_id = stream_id_of(args, "chat_id", "stream_id")
    if not stream_id:
        return {"success": False, "error": "message.get_by_time_in_chat needs chat_id"}
    return await _by_time(args, stream_id)


async def get_by_time(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """message.get_by_time: as get_by_time_in_chat, over every chat (MaiBot 1.2's arguments and result)."""
    return await _by_time(args, "")


async def _by_time(args: dict[str, Any], stream_id: str) -> dict[str, Any]:
    """Messages with start_time <= time <= end_time, of one chat (`stream_id`) or of all ("")."""
    from chat.models import Message

    try:
        start = instant(args.get("start_time"), "start_time")
        end = instant(args.get("end_time"), "end_time")
        limit = int(args.get("limit") or 0)
    except (TypeError, ValueError) as exc:
        return {"success": False, "error": str(exc)}
    if limit < 0:
        return {"success": False, "error": "limit must not be negative"}
    limit = min(limit or MAX_BY_TIME, MAX_BY_TIME)
    mode = str(args.get("limit_mode") or "latest")
    if mode not in ("latest", "earliest"):
        return {"success": False, "error": "limit_mode is latest or earliest"}

    def read() -> dict[str, Any]:
        session = session_of(stream_id) if stream_id else None
        if stream_id and session is None:
            return {"success": False, "error": f"there is no chat with stream_id {stream_id}"}
        rows = session.messages if session is not None else Message.objects.select_related("session")
        rows = rows.filter(time__gte=start, time__lte=end)
        if args.get("filter_mai"):
            rows = rows.exclude(direction="out")
        if mode == "earliest":
            found = list(rows.order_by("time", "pk")[:limit])
        else:
            found = list(reversed(rows.order_by("-time", "-pk")[:limit]))
        return {"success": True, "messages": [message(m, session or m.session) for m in found]}

    return await db(read)


def _when(timestamp: float, mode: str, now: float, tz) -> str:
    # MaiBot's modes: normal, normal_no_ymd, relative (Chinese, as its prompts are).
    if mode == "normal":
        return datetime.fromtimestamp(timestamp, tz).strftime("%Y-%m-%d %H:%M:%S")
    if mode == "normal_no_ymd":
        return datetime.fromtimestamp(timestamp, tz).strftime("%H:%M:%S")
    ago = now - timestamp
    if ago < 20:
        return "刚刚"
    if ago < 60:
        return f"{int(ago)}秒前"
    if ago < 3600:
        return f"{int(ago // 60)}分钟前"
    if ago < 86400:
        return f"{int(ago // 3600)}小时前"
    if ago < 2592000:
        return f"{int(ago // 86400)}天前"
    return datetime.fromtimestamp(timestamp, tz).strftime("%Y-%m-%d %H:%M:%S")


def readable(messages: list[dict[str, Any]], *, replace_bot_name: bool, mode: str, truncate: bool) -> str:
    """Messages as MaiBot's build_readable writes them: `[when] name说：text`, one per line (the bot's
    nickname in the text becomes 你)."""
    import time

    from core.config import get_config

    cfg = get_config()
    now = time.time()
    lines = []
    for m in messages:
        text = str(m.get("processed_plain_text") or "").strip()
        if replace_bot_name and cfg.bot.nickname:
            text = text.replace(cfg.bot.nickname, "你")
        user = ((m.get("message_info") or {}).get("user_info")) or {}
        if m.get("is_bot_message"):
            name = cfg.bot.nickname
        else:
            name = user.get("user_cardname") or user.get("user_nickname") or user.get("user_id") or "?"
        prefix = []
        if mode:
            try:
                timestamp = float(m.get("timestamp") or 0)
            except (TypeError, ValueError):
                timestamp = 0.0
            prefix.append(f"[{_when(timestamp, mode, now, cfg.tzinfo)}]")
        prefix.append(f"{name}说：")
        line = " ".join(prefix) + text
        if truncate and len(line) > 200:
            line = f"{line[:200]}......（内容太长了）"
        lines.append(line)
    return "\n".join(lines)


async def build_readable(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """The readable text of messages the plugin passes (as message.* returned them), or of a chat's
    messages between start_time and end_time."""
    mode = str(args.get("timestamp_mode") or "relative").lower()
    if mode not in ("relative", "normal", "normal_no_ymd"):
        return {"success": False, "error": "timestamp_mode is relative, normal or normal_no_ymd"}
    options = {
        "replace_bot_name": bool(args.get("replace_bot_name", True)),
        "mode": mode,
        "truncate": bool(args.get("truncate", False)),
    }
    messages = args.get("messages")
    if messages is None:
        if not stream_id_of(args, "chat_id", "stream_id"):
            return {"success": False, "error": "message.build_readable needs messages or chat_id"}
        found = await get_by_time_in_chat(record, {"start_time": 0, "end_time": 4102444800, **args})
        if not found.get("success"):
            return found
        messages = found["messages"]
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return {"success": False, "error": "messages must be a list of messages (as message.* returned them)"}
    if len(messages) > MAX_BY_TIME:
        return {"success": False, "error": f"at most {MAX_BY_TIME} messages"}
    return {"success": True, "text": readable(messages, **options)}


async def count_new(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """message.count_new: how many messages (the bot's too) one chat has after `since` (or `start_time`;
    exclusive), up to `end_time` (inclusive) when given, as MaiBot's count_messages."""
    stream_id = stream_id_of(args, "chat_id", "stream_id")
    if not stream_id:
        return {"success": False, "error": "缺少必要参数 chat_id"}
    since = args.get("since")
    try:
        start = instant(since if since is not None else args.get("start_time", 0), "since")
        end = instant(args["end_time"], "end_time") if args.get("end_time") not in (None, "") else None
    except ValueError as exc:
        return {"success": False, "error": str(exc)}

    def count() -> int:
        session = session_of(stream_id)
        if session is None:
            return 0
        rows = session.messages.filter(time__gt=start)
        return (rows.filter(time__lte=end) if end is not None else rows).count()

    return {"success": True, "count": await db(count)}
