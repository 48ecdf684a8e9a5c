"""emoji.*: the emoji library (chat.models.Emoji: every emoji the bot has, received in chats, sent, or
registered by a plugin; the operator describes them in the admin). Sending one is send.emoji.

Arguments and results are MaiBot 1.3's (src/plugin_runtime/capabilities/data.py): an emoji is
{"base64", "description", "emotion"} (emotion: the first tag of its description, or its emotion;
"随机表情" for an undescribed one in get_random / get_all); get_by_description picks as the planner's
send_emoji does (chat.actions.emoji_choose: the most words in common, ties to the least used) and
answers None when nothing matches; get_random, get_count, get_emotions, get_all, get_info; register
(base64 → stored, `hash` = its SHA-256; already there → "skipped") and delete (by that hash).

Bounds: one answer carries at most MAX_ANSWER emojis and MAX_ANSWER_BYTES of them (get_all and
get_random stop there; the most used first for get_all). register takes an image up to the media size
limit, from the plugin's media budget; the library takes plugin registrations up to LIBRARY_MAX emojis
(get_info's max_count). Unlike MaiBot, a plugin deletes only an emoji it registered itself, and none
that a message still shows; the operator deletes any in the admin.
"""

from __future__ import annotations

import base64
import hashlib
import random
from typing import TYPE_CHECKING, Any

from plugins import limits
from plugins.capabilities.common import CapabilityArgError, db, media_paid_by, media_segment

if TYPE_CHECKING:
    from chat.models import Emoji
    from plugins.records import PluginRecord

MAX_ANSWER = 100  # emojis one answer carries
MAX_ANSWER_BYTES = 24 * 1024 * 1024  # their base64, within a runner frame (32 MiB)
LIBRARY_MAX = 10_000  # emojis in the library past which plugins register no more
RANDOM_EMOTION = "随机表情"


def _tags(text: str) -> list[str]:
    """MaiBot's tag split: commas (either width), 、 and ；, deduplicated in order."""
    parts = text.replace("，", ",").replace("、", ",").replace("；", ",").split(",")
    tags: list[str] = []
    for part in (p.strip() for p in parts):
        if part and part not in tags:
            tags.append(part)
    return tags


def _emotion(emoji: Emoji) -> str:
    tags = _tags(emoji.description or emoji.emotion)
    return tags[0] if tags else ""


def _payload(emoji: Emoji) -> dict[str, str] | None:
    try:
        with emoji.file.open("rb") as fh:
            encoded = base64.b64encode(fh.read()).decode()
    except (OSError, ValueError):
        return None  # as MaiBot: an emoji whose file is gone is left out
    return {"base64": encoded, "description": emoji.description, "emotion": _emotion(emoji)}


def _payloads(emojis, undescribed: str = RANDOM_EMOTION) -> list[dict[str, str]]:
    answer, size = [], 0
    for emoji in emojis:
        item = _payload(emoji)
        if item is None:
            continue
        size += len(item["base64"])
        if len(answer) >= MAX_ANSWER or size > MAX_ANSWER_BYTES:
            break
        item["emotion"] = item["emotion"] or undescribed
        answer.append(item)
    return answer


def _library():
    from chat.models import Emoji

    return Emoji.objects.filter(kind="emoji")


async def get_by_description(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.actions import emoji_choose

    description = str(args.get("description") or "").strip()
    if not description:
        return {"success": False, "error": "缺少必要参数 description"}

    def pick() -> dict[str, str] | None:
        chosen = emoji_choose(description[:500])
        return None if chosen is None else _payload(chosen)

    return {"success": True, "emoji": await db(pick)}


async def get_random(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    count = args.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int):
        return {"success": False, "error": f"count must be a whole number, not {count!r}"}
    if count < 0:
        return {"success": False, "error": "count 不能为负数"}

    def pick() -> list[dict[str, str]]:
        ids = list(_library().values_list("pk", flat=True))
        chosen = random.sample(ids, min(count, len(ids), MAX_ANSWER))
        by_id = _library().in_bulk(chosen)
        return _payloads(by_id[pk] for pk in chosen)

    return {"success": True, "emojis": await db(pick) if count else []}


async def get_count(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return {"success": True, "count": await db(lambda: _library().count())}


async def get_emotions(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    def emotions() -> list[str]:
        texts = _library().values_list("description", "emotion")
        return sorted({tag for description, emotion in texts for tag in _tags(description or emotion)})

    return {"success": True, "emotions": await db(emotions)}


async def get_all(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    def every() -> list[dict[str, str]]:
        return _payloads(_library().order_by("-usage_count", "-pk")[: MAX_ANSWER * 2])

    return {"success": True, "emojis": await db(every)}


async def get_info(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    count = await db(lambda: _library().count())
    return {"success": True, "info": {"current_count": count, "max_count": LIBRARY_MAX, "available_emojis": count}}


def _register_failed(message: str) -> dict[str, Any]:
    return {"success": False, "message": message, "description": None, "emotions": None, "replaced": None, "hash": None}


def _register(record: PluginRecord, encoded: str) -> dict[str, Any]:
    from chat.media import MediaError, decode_base64

    try:
        digest = hashlib.sha256(decode_base64(encoded.strip())).hexdigest()
    except MediaError as exc:
        return _register_failed(f"表情包注册失败: {exc}")
    if _library().filter(sha256=digest).exists():
        return {**_register_failed("表情包已注册，已跳过本次注册"), "success": True, "replaced": False}
    if _library().count() >= LIBRARY_MAX:
        return _register_failed(f"表情包注册失败: the library holds {LIBRARY_MAX} emojis (its limit)")
    try:
        with media_paid_by(lambda size: limits.charge_media(record, size)):
            media_segment("emoji", encoded, "emoji_base64")
    except CapabilityArgError as exc:
        return _register_failed(f"表情包注册失败: {exc}")
    _library().filter(sha256=digest, registered_by="").update(registered_by=record.plugin_id)
    return {
        "success": True,
        "message": "表情包注册成功 (新增表情包)",
        "description": "",
        "emotions": [],
        "replaced": False,
        "hash": digest,
    }


async def register(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    encoded = args.get("emoji_base64")
    if not isinstance(encoded, str) or not encoded.strip():
        return {"success": False, "error": "缺少必要参数 emoji_base64"}
    return await db(lambda: _register(record, encoded))


def _delete(record: PluginRecord, emoji_hash: str, keep_desc: Any) -> dict[str, Any]:
    from chat.models import Message

    emoji = _library().filter(sha256=emoji_hash).first()
    if emoji is None:
        return {"success": False, "message": f"未找到表情包: {emoji_hash}", "hash": emoji_hash}
    if emoji.registered_by != record.plugin_id:
        reason = f"删除表情包失败: {emoji_hash} was not registered by plugin {record.plugin_id}"
        return {"success": False, "message": reason, "hash": emoji_hash}
    if Message.objects.filter(segments__icontains=emoji_hash).exists():
        reason = f"删除表情包失败: {emoji_hash} is shown by a stored message"
        return {"success": False, "message": reason, "hash": emoji_hash}
    keep = bool(emoji.description.strip()) if keep_desc is None else bool(keep_desc)
    emoji.file.delete(save=False)
    emoji.delete()
    return {"success": True, "message": f"成功删除表情包: {emoji_hash}", "hash": emoji_hash, "keep_desc": keep}


async def delete(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    emoji_hash = str(args.get("emoji_hash") or "").strip().lower()
    if not emoji_hash:
        return {"success": False, "error": "缺少必要参数 emoji_hash"}
    return await db(lambda: _delete(record, emoji_hash[:64], args.get("keep_desc")))
