"""frequency.set_adjust / get_adjust / get_current_talk_value: a plugin turns one chat's talk frequency up
or down (chat.talk.talk_adjust: a factor on chat.talk_frequency and its rules, ≥ 0, kept in this process
as MaiBot keeps it on the chat's runtime). MaiBot 1.3's arguments (`chat_id`, `value`) and results
({"success"} / {"success", "value"}); the current talk value is the configured frequency in force now
times the factor. Unlike MaiBot, which answers success for a chat it does not know, an unknown chat is
an error."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from plugins.capabilities.common import db, session_of, stream_id_of

if TYPE_CHECKING:
    from plugins.records import PluginRecord


async def _chat(args: dict[str, Any]):
    stream_id = stream_id_of(args, "chat_id", "stream_id")
    return stream_id, (await db(lambda: session_of(stream_id)) if stream_id else None)


async def set_adjust(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.talk import talk_adjust_set

    stream_id, session = await _chat(args)
    value = args.get("value")
    if not stream_id or value is None:
        return {"success": False, "error": "缺少必要参数 chat_id 或 value"}
    if session is None:
        return {"success": False, "error": f"there is no chat with chat_id {stream_id}"}
    try:
        talk_adjust_set(session.session_id, max(0.0, float(value)))
    except (TypeError, ValueError) as exc:
        return {"success": False, "error": str(exc)}
    return {"success": True}


async def get_adjust(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.talk import talk_adjust

    stream_id = stream_id_of(args, "chat_id", "stream_id")
    if not stream_id:
        return {"success": False, "error": "缺少必要参数 chat_id"}
    return {"success": True, "value": talk_adjust(stream_id)}


async def get_current_talk_value(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.talk import talk_frequency

    stream_id, session = await _chat(args)
    if not stream_id:
        return {"success": False, "error": "缺少必要参数 chat_id"}
    if session is None:
        return {"success": False, "error": f"there is no chat with chat_id {stream_id}"}
    return {"success": True, "value": talk_frequency(session)}
