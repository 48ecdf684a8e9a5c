"""send.*: text, image, custom, forward and hybrid messages, all through the one send service
(chat.services.message_send), so delivery state, retries and fate hold as for every other message.

The segments are the ones maim_message adapters accept (the NapCat adapter's send handler): text,
image (bare base64; stored here once in the media store and put back in the frame), a custom
`{type, data}` segment as given (a lone `command` goes out as the top-level segment), and `forward`,
whose data is a list of maim_message messages (`message_info.user_info` naming the node's author,
`message_segment` its content) and which the adapter sends alone.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from plugins.capabilities.common import (
    MAX_FORWARD_NODES,
    MAX_ID,
    CapabilityArgError,
    db,
    media_paid_by,
    media_segment,
    plugin_segment,
    plugin_segments,
    session_of,
    stream_id_of,
    text_problem,
)
from plugins.limits import charge_media

if TYPE_CHECKING:
    from plugins.records import PluginRecord

# How long a send with return_details waits for the adapter's echo (the platform's message id).
DETAILS_WAIT = 10.0
DETAILS_POLL = 0.1


def _result(args: dict[str, Any], sent: bool, error: str = "", message_id: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"success": sent}
    if args.get("return_details"):
        result.update({"sent": sent, "message_id": message_id})
    if error:
        result["error"] = error
    return result


async def _platform_id(message_pk: int, wait: float) -> str | None:
    """The platform's id of a message once the adapter echoes it; None if no echo within `wait`."""
    from chat.models import Message

    deadline = time.monotonic() + wait
    while True:
        found = await db(
            lambda: Message.objects.filter(pk=message_pk).values_list("platform_message_id", flat=True).first()
        )
        if found:
            return found
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(DETAILS_POLL)


async def _send(
    record: PluginRecord,
    capability: str,
    args: dict[str, Any],
    build,
) -> dict[str, Any]:
    """Resolve the stream, build the segments (in the worker thread: media is stored) and send."""
    from chat.models import SourceKind
    from chat.services import message_send

    stream_id = stream_id_of(args, "stream_id")
    if not stream_id:
        return _result(args, False, f"{capability} needs stream_id")

    def send() -> tuple[int | None, str]:
        session = session_of(stream_id)
        if session is None:
            return None, f"there is no chat with stream_id {stream_id}"
        try:
            with media_paid_by(lambda size: charge_media(record, size)):
                segments, text = build(session)
        except CapabilityArgError as exc:
            return None, str(exc)
        sent = message_send(
            session=session,
            source_kind=SourceKind.REPLY,
            segments=segments,
            text=text,
            extra={"plugin": record.plugin_id, "capability": capability},
        )
        return sent.pk, ""

    pk, error = await db(send)
    if error:
        return _result(args, False, error)
    message_id = await _platform_id(pk, DETAILS_WAIT) if args.get("return_details") else None
    return _result(args, True, message_id=message_id)


async def send_text(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    text = args.get("text")
    if not isinstance(text, str):
        return _result(args, False, "send.text needs text (a string)")
    if problem := text_problem(text):
        return _result(args, False, problem)
    reply_to = str(args.get("reply_to") or args.get("reply_message_id") or "").strip()[:MAX_ID]

    def build(session):
        segments = [{"type": "text", "data": text}]
        if reply_to:
            segments.insert(0, {"type": "reply", "data": reply_to})
        return segments, text

    return await _send(record, "send.text", args, build)


async def send_image(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    encoded = args.get("image_base64")

    def build(session):
        return [media_segment("image", encoded, "image_base64")], "[image]"

    return await _send(record, "send.image", args, build)


async def send_emoji(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    encoded = args.get("emoji_base64")

    def build(session):
        return [media_segment("emoji", encoded, "emoji_base64")], "[emoji]"

    return await _send(record, "send.emoji", args, build)


def _processed_text(args: dict[str, Any], fallback: str) -> str:
    text = args.get("processed_plain_text")
    if isinstance(text, str) and text.strip() and not text_problem(text):
        return text
    return fallback


async def send_custom(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    kind = str(args.get("message_type") or args.get("custom_type") or "").strip()
    content = args.get("content")
    if content is None:
        content = args.get("data")

    def build(session):
        if not kind:
            raise CapabilityArgError("send.custom needs message_type (custom_type)")
        segment = plugin_segment({"type": kind, "data": content}, "send.custom")
        return [segment], _processed_text(args, f"[{segment['type']}]")

    return await _send(record, "send.custom", args, build)


async def send_command(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """send.command: MaiBot sends it as a custom message of type "command" (`command` its content); an
    adapter receives it as the top-level `command` segment (chat.wire.outbound). An adapter that does not
    accept commands (an adapter plugin's gateway) fails it as unsupported_segments."""
    command = args.get("command")

    def build(session):
        if command in (None, "", {}):
            raise CapabilityArgError("send.command needs command")
        segment = plugin_segment({"type": "command", "data": command}, "send.command")
        return [segment], _processed_text(args, "[command]")

    return await _send(record, "send.command", args, build)


async def send_hybrid(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    raw = args.get("segments") or args.get("parts")

    def build(session):
        from chat.services import plain_text

        segments = plugin_segments(raw, "segments")
        return segments, _processed_text(args, plain_text(segments))

    return await _send(record, "send.hybrid", args, build)


def forward_node(session, raw: Any, index: int) -> tuple[dict[str, Any], str] | None:
    """One node of a forward: a maim_message message (who said it, what), as the NapCat adapter reads
    it (`MessageBase.from_dict`: user_info's user_id and nickname become the node's uin and name)."""
    from chat.services import plain_text
    from chat.wire.outbound import wire_id

    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise CapabilityArgError(f"{where} must be an object")
    content = raw.get("segments") or raw.get("content") or []
    if isinstance(content, str):
        content = [{"type": "text", "data": content}]
    if not content:
        return None  # as MaiBot: a node without content is left out
    segments = plugin_segments(content, f"{where}.segments")
    user_id = str(raw.get("user_id") or "").strip()[:MAX_ID]
    nickname = str(raw.get("nickname") or raw.get("user_nickname") or "").strip()[:255] or "QQ用户"
    node = {
        "message_info": {
            "platform": session.platform,
            "message_id": str(raw.get("message_id") or f"plugin_forward_{index}")[:MAX_ID],
            "user_info": {
                "platform": session.platform,
                "user_id": wire_id(user_id) if user_id else user_id,
                "user_nickname": nickname,
                "user_cardname": str(raw.get("user_cardname") or "")[:255],
            },
        },
        "message_segment": {"type": "seglist", "data": segments},
    }
    return node, f"{nickname}: {plain_text(segments)}"


async def send_forward(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    raw = args.get("messages")

    def build(session):
        if not isinstance(raw, list) or not raw:
            raise CapabilityArgError("send.forward needs messages (a non-empty list)")
        if len(raw) > MAX_FORWARD_NODES:
            raise CapabilityArgError(f"send.forward takes at most {MAX_FORWARD_NODES} messages")
        nodes = [n for n in (forward_node(session, m, i) for i, m in enumerate(raw)) if n is not None]
        if not nodes:
            raise CapabilityArgError("messages hold no node with content")
        summary = "\n".join(line for _, line in nodes)
        text = _processed_text(args, f"[forward]\n{summary}"[:4000])
        return [{"type": "forward", "data": [node for node, _ in nodes]}], text

    return await _send(record, "send.forward", args, build)
