"""MaiBot's MessageDict, the message shape adapter plugins' gateways speak (MaiBot's
src/plugin_runtime/host/message_utils.py, maibot-plugin-sdk 2.16), and our maim_message envelope, both ways:

- `RouteMessage` / `StateUpdate`: the payloads of the raw host methods `host.route_message` and
  `host.update_message_gateway_state` (MaiBot's protocol/envelope.py RouteMessagePayload and
  MessageGatewayStateUpdatePayload), checked with bounds: ids and names of bounded length, at most
  MAX_SEGMENTS segments, and a message of at most MAX_MESSAGE_BYTES as JSON (`message_size`).
- `inbound_envelope`: a gateway's MessageDict as the envelope a maim_message adapter would have sent (what
  chat.wire.inbound parses): `user_info` / `group_info` as they came, the bot's account as receiver, text
  segments as they are (MaiBot's text `data` is a string), an `at` segment as our mention text
  `@<name:id>` (what the standalone NapCat adapter writes), a quote as `additional_config.reply_message_id`,
  images / emojis / voice as bare base64 (from `binary_data_base64`; without bytes, their text `[image]`),
  a forward as readable text, anything else kept as it came.
- `outbound_message`: one of our outbound envelopes as the MessageDict a gateway's handler reads: the
  target in `group_info` (with the bot in `user_info`, as MaiBot sends) or `user_info` and
  `additional_config.platform_io_target_group_id` / `platform_io_target_user_id` (what the NapCat plugin
  sends to), segments in MaiBot's shapes (text data a string, `reply` {target_message_id}, media with
  `binary_data_base64` and its sha256 `hash`, forward nodes {user_id, user_nickname, message_id, content}).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

MAX_SEGMENTS = 500
MAX_MESSAGE_BYTES = 24 * 1024 * 1024  # a routed MessageDict as JSON (base64 media included)
MEDIA_TYPES = ("image", "emoji", "voice")
# What a gateway is handed unless its component's metadata names its own `accept_format`: the segment types
# MaiBot's message components and the NapCat plugin's outbound encoder know (no `command`).
GATEWAY_ACCEPT_FORMAT = [
    "text", "reply", "at", "image", "emoji", "voice", "imageurl", "voiceurl", "videourl", "video", "file",
    "face", "music", "forward",
]  # fmt: skip
_MENTION_NAME_UNSAFE = re.compile(r"[:<>]")


class _Lenient(BaseModel):
    # Ids may come as numbers (NapCat passes them through): coerced to str; unknown fields ignored.
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)


class StateUpdate(_Lenient):
    gateway_name: str = Field(default="", max_length=128)
    ready: StrictBool
    platform: str = Field(default="", max_length=64)
    account_id: str = Field(default="", max_length=128)
    scope: str = Field(default="", max_length=128)
    metadata: dict[str, Any] = Field(default_factory=dict, max_length=32)


class RouteMessage(_Lenient):
    gateway_name: str = Field(default="", max_length=128)
    message: dict[str, Any]
    route_metadata: dict[str, Any] = Field(default_factory=dict, max_length=32)
    external_message_id: str = Field(default="", max_length=128)
    dedupe_key: str = Field(default="", max_length=256)


class UserInfoDict(_Lenient):
    user_id: str = Field(min_length=1, max_length=128)
    user_nickname: str | None = Field(default=None, max_length=255)
    user_cardname: str | None = Field(default=None, max_length=255)


class GroupInfoDict(_Lenient):
    group_id: str = Field(min_length=1, max_length=128)
    group_name: str | None = Field(default=None, max_length=255)


class MessageInfoDict(_Lenient):
    user_info: UserInfoDict
    group_info: GroupInfoDict | None = None
    additional_config: dict[str, Any] = Field(default_factory=dict)


class MessageDict(_Lenient):
    message_id: str = Field(min_length=1, max_length=128)
    timestamp: str | None = Field(default=None, max_length=64)
    platform: str = Field(min_length=1, max_length=64)
    message_info: MessageInfoDict
    raw_message: list[dict[str, Any]] = Field(max_length=MAX_SEGMENTS)
    is_mentioned: Any = False
    is_at: Any = False
    processed_plain_text: str | None = None


def message_size(message: dict[str, Any]) -> int:
    """Bytes of the message as JSON (run it in a thread: a message may carry megabytes of media)."""
    return len(json.dumps(message, ensure_ascii=False, default=str).encode("utf-8"))


def _mention(data: Any) -> str:
    if not isinstance(data, dict):
        return ""
    target = str(data.get("target_user_id") or "").strip()
    if not target:
        return ""
    name = str(data.get("target_user_cardname") or data.get("target_user_nickname") or target)
    return f"@<{_MENTION_NAME_UNSAFE.sub('', name).strip() or target}:{target}>"


def _forward_text(nodes: Any) -> str:
    lines = ["[forward]"]
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict):
            continue
        name = str(node.get("user_cardname") or node.get("user_nickname") or node.get("user_id") or "?")
        content = node.get("content") if isinstance(node.get("content"), list) else []
        text = "".join(str(s.get("data") or "") if s.get("type") == "text" else f"[{s.get('type')}]" for s in content)
        lines.append(f"{name}: {text}")
    return "\n".join(lines)


def _inbound_segments(raw: list[dict[str, Any]], additional: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for seg in raw:
        kind, data = str(seg.get("type") or "").strip()[:64], seg.get("data")
        if not kind:
            continue
        if kind == "text":
            if data not in (None, ""):
                out.append({"type": "text", "data": str(data)})
        elif kind == "at":
            if mention := _mention(data):
                out.append({"type": "text", "data": mention})
        elif kind == "reply":
            target = data.get("target_message_id") if isinstance(data, dict) else data
            if str(target or "").strip():
                additional.setdefault("reply_message_id", str(target).strip()[:128])
        elif kind in MEDIA_TYPES:
            encoded = seg.get("binary_data_base64")
            if isinstance(encoded, str) and encoded:
                out.append({"type": kind, "data": encoded})
            else:
                out.append({"type": "text", "data": f"[{kind}]"})
        elif kind == "forward":
            out.append({"type": "text", "data": _forward_text(data)})
        else:
            out.append({"type": kind, "data": data})
    return out


def inbound_envelope(message: MessageDict, *, platform: str, account: str, route_metadata: dict[str, Any]) -> dict:
    """The maim_message envelope of a gateway's inbound MessageDict (already checked by MessageDict)."""
    info = message.message_info
    additional = dict(info.additional_config)
    for key, value in route_metadata.items():  # as MaiBot: the route's helpers join additional_config
        if isinstance(value, str | int | float) and str(value).strip():
            additional.setdefault(str(key)[:64], value)
    segments = _inbound_segments(message.raw_message, additional)
    if not segments:
        segments = [{"type": "text", "data": message.processed_plain_text or "[empty]"}]
    try:
        sent_at = float(message.timestamp) if message.timestamp else None
    except ValueError:
        sent_at = None
    user = info.user_info
    envelope_info: dict[str, Any] = {
        "platform": platform,
        "message_id": message.message_id,
        "time": sent_at,
        "user_info": {
            "platform": platform,
            "user_id": user.user_id,
            "user_nickname": user.user_nickname or user.user_id,
            "user_cardname": user.user_cardname or "",
        },
        "additional_config": additional,
    }
    if info.group_info is not None:
        group = info.group_info
        envelope_info["group_info"] = {
            "platform": platform,
            "group_id": group.group_id,
            "group_name": group.group_name or group.group_id,
        }
    if account:
        envelope_info["receiver_info"] = {"user_info": {"platform": platform, "user_id": account}}
    return {
        "message_info": envelope_info,
        "message_segment": {"type": "seglist", "data": segments},
        "raw_message": message.processed_plain_text,
    }


def _media(kind: str, encoded: Any) -> dict[str, Any]:
    if not isinstance(encoded, str):
        return {"type": kind, "data": encoded}
    try:
        digest = hashlib.sha256(base64.b64decode(encoded, validate=False)).hexdigest()
    except (binascii.Error, ValueError):
        digest = ""
    return {"type": kind, "data": "", "hash": digest, "binary_data_base64": encoded}


def _forward_nodes(nodes: Any) -> list[dict[str, Any]]:
    out = []
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, dict):
            continue
        info = node.get("message_info") if isinstance(node.get("message_info"), dict) else {}
        user = info.get("user_info") if isinstance(info.get("user_info"), dict) else {}
        segment = node.get("message_segment") if isinstance(node.get("message_segment"), dict) else {}
        content = segment.get("data") if segment.get("type") == "seglist" else [segment]
        out.append(
            {
                "user_id": str(user.get("user_id") or "") or None,
                "user_nickname": str(user.get("user_nickname") or "QQ用户"),
                "user_cardname": str(user.get("user_cardname") or "") or None,
                "message_id": str(info.get("message_id") or ""),
                "content": outbound_segments(content if isinstance(content, list) else []),
            }
        )
    return out


def outbound_segments(segments: list[Any]) -> list[dict[str, Any]]:
    """Our segments (as the outbox built them: media inlined as base64) in MaiBot's component shapes."""
    out: list[dict[str, Any]] = []
    for seg in segments:
        if not isinstance(seg, dict):
            continue
        kind, data = seg.get("type"), seg.get("data")
        if kind == "seglist" and isinstance(data, list):
            out.extend(outbound_segments(data))
        elif kind == "text":
            out.append({"type": "text", "data": "" if data is None else str(data)})
        elif kind == "reply":
            out.append({"type": "reply", "data": {"target_message_id": str(data)}})
        elif kind in MEDIA_TYPES:
            out.append(_media(kind, data))
        elif kind == "forward":
            out.append({"type": "forward", "data": _forward_nodes(data)})
        else:
            out.append({"type": kind, "data": data})
    return out


def outbound_message(frame: dict[str, Any], *, account: str, scope: str) -> dict[str, Any]:
    """The MessageDict a gateway's handler gets for one outbound envelope (chat.wire.outbound)."""
    info = frame["message_info"]
    user = info.get("user_info") or {}
    group = info.get("group_info")
    additional: dict[str, Any] = {}
    if account:
        additional.update(self_id=account, platform_io_account_id=account)
    if scope:
        additional["platform_io_scope"] = scope
    if group:
        additional["platform_io_target_group_id"] = str(group["group_id"])
    else:
        additional["platform_io_target_user_id"] = str(user.get("user_id") or "")
    message_info: dict[str, Any] = {
        "user_info": {
            "user_id": str(user.get("user_id") or account or ""),
            "user_nickname": str(user.get("user_nickname") or ""),
            "user_cardname": str(user.get("user_cardname") or "") or None,
        },
        "group_info": {"group_id": str(group["group_id"]), "group_name": str(group.get("group_name") or "")}
        if group
        else None,
        "additional_config": additional,
    }
    top = frame["message_segment"]
    raw = outbound_segments([top])
    text = str(frame.get("raw_message") or "")
    return {
        "message_id": str(info["message_id"]),
        "timestamp": str(info.get("time") or ""),
        "platform": str(info["platform"]),
        "message_info": message_info,
        "raw_message": raw,
        "is_mentioned": False,
        "is_at": False,
        "is_emoji": False,
        "is_picture": False,
        "is_command": False,
        "is_notify": False,
        "session_id": "",
        "processed_plain_text": text,
        "display_message": text,
    }
