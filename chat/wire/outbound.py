"""Outbound frames: the maim_message envelope an adapter receives for one of our messages (and the
API-Server package wrapping it for an adapter in that mode, with the `sys_ack` that mode expects for
each frame it sends), the text frame of the 0.6.x plain websocket, and the frame the browser chat page
receives. Inbound parsing is in chat.wire.inbound."""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from datetime import datetime
from typing import Any, Protocol

from django.utils import timezone

from chat.accounts import bot_account
from chat.delivery_errors import DeliveryError
from chat.models import ChatSession, Media
from chat.wire.inbound import MEDIA_SEGMENT_TYPES
from core.config import get_config

logger = logging.getLogger(__name__)


class OutboundMessage(Protocol):
    """What a frame needs of a message: a Message, or the outbox's lighter claimed row."""

    uid: Any
    direction: str
    source_kind: str
    text: str
    segments: list
    time: datetime


def wire_id(value: str) -> str | int:
    """Ids go back the way NapCat-style adapters send them: canonical decimal strings as integers."""
    if value.isdigit() and str(int(value)) == value:
        return int(value)
    return value


def _media_base64(sha: str, kind: str) -> str | None:
    media = Media.objects.filter(sha256=sha, kind=kind).first() or Media.objects.filter(sha256=sha).first()
    if media is None:
        return None
    try:
        with media.file.open("rb") as fh:
            return base64.b64encode(fh.read()).decode("ascii")
    except OSError as exc:
        logger.error("media %s (%s) cannot be read: %s", sha[:12], kind, exc)
        return None


def _adapter_segments(
    segments: list[dict[str, Any]], accept: set[str] | None
) -> tuple[list[dict[str, Any]], DeliveryError | None]:
    out: list[dict[str, Any]] = []
    for seg in segments:
        kind, data = seg.get("type"), seg.get("data")
        if kind == "seglist" and isinstance(data, list):
            inner, error = _adapter_segments(data, accept)
            if error:
                return [], error
            if inner:
                out.append({"type": "seglist", "data": inner})
            continue
        if accept is not None and kind not in accept:
            logger.info("segment type %r dropped: not in the adapter's accept_format", kind)
            continue
        if kind == "forward" and isinstance(data, list):
            # Each node is a maim_message message of its own: its media go out as base64 too.
            nodes = []
            for node in data:
                inner_segment = node.get("message_segment") if isinstance(node, dict) else None
                if isinstance(inner_segment, dict) and isinstance(inner_segment.get("data"), list):
                    inner, error = _adapter_segments(inner_segment["data"], accept)
                    if error:
                        return [], error
                    node = {**node, "message_segment": {**inner_segment, "data": inner}}
                nodes.append(node)
            data = nodes
        if kind in MEDIA_SEGMENT_TYPES and isinstance(data, dict) and data.get("media"):
            encoded = _media_base64(str(data["media"]), kind)
            if encoded is None:
                return [], DeliveryError.MEDIA_MISSING
            data = encoded
        out.append({"type": kind, "data": data})
    return out, None


def adapter_envelope(
    message: OutboundMessage, session: ChatSession, accept_format: list[str] | None
) -> tuple[dict[str, Any], DeliveryError | None]:
    """The maim_message envelope for one outbound message, or ({}, error) when nothing sendable is left.

    A private message names the recipient in user_info (the adapter sends to user_info.user_id); a
    group message names the group in group_info and the bot itself in user_info, as MaiBot's core does
    (the NapCat adapter sends to a group only when both are present, and drops the message otherwise).
    Only segment types the adapter declared in accept_format are sent.
    """
    accept = set(accept_format) if accept_format else None
    segments, error = _adapter_segments(list(message.segments), accept)
    if error:
        return {}, error
    if not segments:
        return {}, DeliveryError.UNSUPPORTED
    info: dict[str, Any] = {
        "platform": session.platform,
        "message_id": str(message.uid),
        "time": message.time.timestamp(),
    }
    if session.is_private:
        info["user_info"] = {
            "platform": session.platform,
            "user_id": wire_id(session.user_id),
            "user_nickname": session.user_nickname,
            "user_cardname": session.user_cardname,
        }
    else:
        info["group_info"] = {
            "platform": session.platform,
            "group_id": wire_id(session.group_id),
            "group_name": session.group_name,
        }
        info["user_info"] = {
            "platform": session.platform,
            "user_id": wire_id(bot_account(session.platform)),
            "user_nickname": get_config().bot.nickname,
            "user_cardname": "",
        }
    info["additional_config"] = {}
    # A lone command goes out as the top-level segment, as adapters expect it.
    if len(segments) == 1 and segments[0]["type"] == "command":
        top = segments[0]
    else:
        top = {"type": "seglist", "data": segments}
    return {"message_info": info, "message_segment": top, "raw_message": message.text}, None


def plain_text_frame(frame: dict[str, Any]) -> str:
    """A frame as the 0.6.x plain websocket carries it: one JSON text frame, non-ASCII kept as is."""
    return json.dumps(frame, ensure_ascii=False)


def browser_frame(message: OutboundMessage) -> dict[str, Any]:
    """What the browser chat page receives for a message of its session."""
    return {
        "type": "message",
        "uid": str(message.uid),
        "direction": message.direction,
        "source_kind": message.source_kind,
        "text": message.text,
        "segments": message.segments,
        "time": timezone.localtime(message.time, get_config().tzinfo).isoformat(),
    }


def api_server_package(envelope: dict[str, Any], *, platform: str) -> dict[str, Any]:
    """An adapter envelope as an API-Server client (maim_message's WebSocketClient) receives it: a
    `sys_std` package whose payload is an APIMessageBase. The recipient moves to
    message_info.receiver_info (MessageConverter.from_api_send, which the NapCat adapter calls, reads
    group_info / user_info from there); message_dim is required by APIMessageBase.from_dict and names the
    platform; its api_key is left empty: the client ignores it, and the adapter's key is not repeated
    on the wire."""
    info = dict(envelope["message_info"])
    receiver = {key: info.pop(key) for key in ("group_info", "user_info") if key in info}
    receiver = {key: value for key, value in receiver.items() if value is not None}
    if receiver:
        info["receiver_info"] = receiver
    now = time.time()
    return {
        "ver": 1,
        "msg_id": f"msg_{uuid.uuid4().hex[:12]}_{int(now)}",
        "type": "sys_std",
        "meta": {"sender_user": "server", "platform": platform, "timestamp": now},
        "payload": {
            "message_info": info,
            "message_segment": envelope["message_segment"],
            "message_dim": {"api_key": "", "platform": platform},
        },
    }


def api_server_ack(msg_id: str, *, connection_uuid: str = "") -> dict[str, Any]:
    """The `sys_ack` an API-Server client expects for each frame it sent (it keeps frames it could not
    send in a cache and resends them on reconnect until acknowledged)."""
    now = time.time()
    return {
        "ver": 1,
        "msg_id": str(uuid.uuid4()),
        "type": "sys_ack",
        "meta": {"uuid": connection_uuid, "acked_msg_id": msg_id, "timestamp": now},
        "payload": {"status": "received", "server_timestamp": now},
    }
