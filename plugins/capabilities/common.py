"""What the capability modules share: bounds, the database hop, how streams and messages look to a
plugin (the shapes MaiBot's host returns), and turning a plugin's segments into ours."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from django.db import connections

if TYPE_CHECKING:
    from chat.models import ChatSession, Message

MAX_TEXT = 10_000  # characters one text segment may carry
MAX_SEGMENTS = 50  # segments one sent message (or one forward node) may carry
MAX_FORWARD_NODES = 100  # nodes one send.forward may carry
MAX_MEDIA_BYTES = 10 * 1024 * 1024  # one image / emoji / voice
MAX_CUSTOM_JSON = 256 * 1024  # the JSON size of one custom segment's data
MAX_DATA_DEPTH = 16  # how deep a custom segment's data may nest
MAX_ID = 128  # a platform user / group / message id
# A segment type a plugin may send: what maim_message adapters use (text, image, command, music, ...).
SEGMENT_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
MEDIA_TYPES = ("image", "emoji", "voice")


class CapabilityArgError(ValueError):
    """The plugin's arguments are unusable; the message says which and why (never a crash)."""


# Who pays for the media a send stores: the plugin's media budget (plugins.limits.charge_media), set
# around the building of one message's segments (in the thread that builds them).
_media_payer: ContextVar[Callable[[int], None] | None] = ContextVar("media_payer", default=None)


@contextmanager
def media_paid_by(charge: Callable[[int], None]) -> Iterator[None]:
    """Media stored within this block is charged to `charge(size)`, which raises to refuse it."""
    token = _media_payer.set(charge)
    try:
        yield
    finally:
        _media_payer.reset(token)


async def db(fn: Callable[[], Any]) -> Any:
    """Run ORM work in a worker thread (the plugins' loop never touches the database itself)."""

    def run() -> Any:
        try:
            return fn()
        finally:
            connections.close_all()

    return await asyncio.to_thread(run)


def stream_id_of(args: dict[str, Any], *keys: str) -> str:
    for key in keys or ("stream_id", "chat_id"):
        value = args.get(key)
        if value:
            return str(value).strip()[:64]
    return ""


def session_of(stream_id: str) -> ChatSession | None:
    from chat.models import ChatSession

    return ChatSession.objects.filter(session_id=stream_id).first() if stream_id else None


def text_problem(text: str) -> str:
    if not text.strip():
        return "text is empty"
    if len(text) > MAX_TEXT:
        return f"text is longer than {MAX_TEXT} characters"
    if "\x00" in text:
        return "text contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text is not valid Unicode (an unpaired surrogate)"
    return ""


def stream(session: ChatSession) -> dict[str, Any]:
    """A chat as MaiBot's host describes a stream; its id is our session_id (stable across restarts)."""
    group = not session.is_private
    return {
        "session_id": session.session_id,
        "stream_id": session.session_id,
        "platform": session.platform,
        "user_id": session.user_id,
        "user_nickname": session.user_nickname,
        "user_cardname": session.user_cardname,
        "group_id": session.group_id,
        "group_name": session.group_name,
        "account_id": "",
        "scope": "",
        "is_group_session": group,
        "chat_type": "group" if group else "private",
    }


def message(message: Message, session: ChatSession) -> dict[str, Any]:
    """A stored message as MaiBot's host serializes one for plugins."""
    return {
        "message_id": message.platform_message_id or str(message.uid),
        "timestamp": str(message.time.timestamp()),
        "time": message.time.isoformat(),
        "platform": session.platform,
        "message_info": {
            "user_info": {
                "platform": session.platform,
                "user_id": message.sender_id,
                "user_nickname": message.sender_nickname,
                "user_cardname": message.sender_cardname,
            },
            "group_info": None
            if session.is_private
            else {"platform": session.platform, "group_id": session.group_id, "group_name": session.group_name},
            "additional_config": {},
        },
        "raw_message": list(message.segments) if isinstance(message.segments, list) else [],
        "processed_plain_text": message.text,
        "display_message": message.text,
        "session_id": session.session_id,
        "chat_id": session.session_id,
        "is_bot_message": message.direction == "out",
        "reply_to": message.reply_to_platform_id or None,
    }


# --- segments from plugins ---------------------------------------------------------------------------


def data_problem(value: Any, max_bytes: int = MAX_CUSTOM_JSON) -> str:
    """Why `value` is not storable JSON (types, NUL, NaN, depth, size), or "" when it is."""
    import json

    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "contains a NUL character"
        elif isinstance(item, dict | list):
            if depth >= MAX_DATA_DEPTH:
                return f"is nested deeper than {MAX_DATA_DEPTH} levels"
            stack.extend((c, depth + 1) for c in (item.values() if isinstance(item, dict) else item))
        elif not (item is None or isinstance(item, bool | int | float)):
            return f"holds a {type(item).__name__}, not JSON"
    try:
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        return f"is not JSON: {exc}"
    if size > max_bytes:
        return f"is larger than {max_bytes} bytes as JSON"
    return ""


def media_segment(kind: str, encoded: Any, where: str) -> dict[str, Any]:
    """A base64 image / emoji / voice stored once in our media store; the segment names it by hash and
    the outbound frame carries the bytes as bare base64, as adapters expect."""
    from chat.media import MediaError, decode_base64, media_store, sniff_mime

    if not isinstance(encoded, str) or not encoded.strip():
        raise CapabilityArgError(f"{where} needs base64 data")
    if len(encoded) > MAX_MEDIA_BYTES * 4 // 3 + 1024:
        raise CapabilityArgError(f"{where} is larger than {MAX_MEDIA_BYTES} bytes")
    try:
        data = decode_base64(encoded.strip())
    except MediaError as exc:
        raise CapabilityArgError(f"{where}: {exc}") from None
    if len(data) > MAX_MEDIA_BYTES:
        raise CapabilityArgError(f"{where} is larger than {MAX_MEDIA_BYTES} bytes")
    mime = sniff_mime(data)
    if kind in ("image", "emoji") and not mime.startswith("image/"):
        raise CapabilityArgError(f"{where} is not an image (PNG, JPEG, GIF or WebP)")
    if (charge := _media_payer.get()) is not None:
        charge(len(data))
    media = media_store(data=data, kind=kind)
    return {"type": kind, "data": {"media": media.sha256}}


def plugin_segment(raw: Any, where: str) -> dict[str, Any]:
    """One segment as a plugin writes it (`{"type": "text", "content": ...}` or `{"type", "data"}`,
    media as base64 in content, data, base64 or image_base64) → our stored segment. Sync (it may store
    media): call it in a worker thread."""
    if not isinstance(raw, dict):
        raise CapabilityArgError(f"{where} must be an object with a type")
    kind = str(raw.get("type") or "").strip().lower()
    if not SEGMENT_TYPE.match(kind):
        raise CapabilityArgError(f"{where}.type must be a segment type such as text or image, got {kind!r}")
    if kind in ("seglist", "forward"):
        raise CapabilityArgError(f"{where}: a {kind} segment cannot be nested here")
    data = raw["data"] if "data" in raw and raw["data"] not in (None, "") else raw.get("content")
    if kind == "text":
        text = "" if data is None else str(data)
        if problem := text_problem(text):
            raise CapabilityArgError(f"{where}: {problem}")
        return {"type": "text", "data": text}
    if kind in MEDIA_TYPES:
        encoded = next(
            (
                raw.get(k)
                for k in ("binary_data_base64", "base64", f"{kind}_base64", "content", "data")
                if isinstance(raw.get(k), str) and raw.get(k)
            ),
            None,
        )
        return media_segment(kind, encoded, where)
    if kind == "reply":
        target = str(data or "").strip()
        if not target or len(target) > MAX_ID:
            raise CapabilityArgError(f"{where}: a reply needs the quoted platform message id")
        return {"type": "reply", "data": target}
    if data is None:
        raise CapabilityArgError(f"{where} ({kind}) has no data")
    if problem := data_problem(data):
        raise CapabilityArgError(f"{where}.data {problem}")
    return {"type": kind, "data": data}


def plugin_segments(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise CapabilityArgError(f"{where} must be a non-empty list of segments")
    if len(raw) > MAX_SEGMENTS:
        raise CapabilityArgError(f"{where} has more than {MAX_SEGMENTS} segments")
    return [plugin_segment(seg, f"{where}[{i}]") for i, seg in enumerate(raw)]
