"""Inbound maim_message frames: parsing an adapter's chat message envelopes and custom messages (receipts,
command results) into validated objects, in legacy mode (MessageBase dicts, custom messages with
`message_type_name`) and in API-Server mode (packages `{ver, msg_id, type, meta, payload}` carrying an
APIMessageBase, `custom_<name>` or `sys_ack`). Outbound frames are built in chat.wire.outbound."""

from __future__ import annotations

import re
from typing import Annotated, Any, NotRequired

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# pydantic needs typing_extensions' TypedDict before Python 3.12.
from typing_extensions import TypedDict

from core.text import text_problem

# Media segment types adapters send as bare base64; we store the bytes once and reference them.
MEDIA_SEGMENT_TYPES = ("image", "emoji", "voice")
MAX_SEGMENT_DEPTH = 16
# How deep the data of one segment (a notify, a card, a type we do not know) may nest: beyond it the
# frame is refused, so nothing stored is too deep to read back (json's recursion limit).
MAX_DATA_DEPTH = 32


# What in a JSON text could decode to an unstorable string: a NUL or a surrogate in the text itself, or
# an escape that decodes to one (\u0000, \uD800-\uDFFF; a pair of surrogate escapes, as an emoji
# under ensure_ascii, is matched too and only costs the full check).
_UNSAFE_IN_JSON_TEXT = re.compile(r"[\x00\ud800-\udfff]|\\u(?:0000|[dD][89abcdefABCDEF])")


def json_text_is_storable(text: str) -> bool:
    """True when no string decoded from the JSON `text` can be unstorable and no value in it nests
    deeper than MAX_DATA_DEPTH, judged from the text alone: then the decoded frame needs no walk over
    its values (`parse_envelope(..., storable=True)`). False means only that the values must be
    checked one by one. Brackets are counted, not matched: those inside strings only make it say
    False more often."""
    return text.count("{") + text.count("[") <= MAX_DATA_DEPTH and not _UNSAFE_IN_JSON_TEXT.search(text)


class _Lenient(BaseModel):
    # Validation runs in pydantic's core, with no Python callbacks: it is on the hot path of every
    # frame. Ids may be integers (NapCat) or strings: numbers are coerced to str. Fields newer
    # library versions add are ignored; nested unset fields arrive as null.
    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)


class UserInfo(_Lenient):
    platform: str | None = None
    user_id: str | None = None
    user_nickname: str | None = None
    user_cardname: str | None = None


class GroupInfo(_Lenient):
    platform: str | None = None
    group_id: str | None = None
    group_name: str | None = None


class FormatInfo(_Lenient):
    content_format: list[str] | None = None
    accept_format: list[str] | None = None


class PartyInfo(_Lenient):
    user_info: UserInfo | None = None
    group_info: GroupInfo | None = None


class MessageInfo(_Lenient):
    platform: str = Field(min_length=1, max_length=64)
    message_id: str | None = None
    time: float | None = None
    user_info: UserInfo | None = None
    group_info: GroupInfo | None = None
    format_info: FormatInfo | None = None
    template_info: Any = None
    additional_config: dict[str, Any] | None = None
    sender_info: PartyInfo | None = None
    receiver_info: PartyInfo | None = None


class Seg(TypedDict):
    """One segment. `data` is a string, a dict (notify, command, cards), or segments (seglist only).

    `data` comes from a JSON decoder, so it is JSON whatever its shape; unknown types keep it as is.
    """

    type: Annotated[str, Field(min_length=1, max_length=64)]
    data: NotRequired[Any]


class Envelope(_Lenient):
    message_info: MessageInfo
    message_segment: Seg
    raw_message: str | None = None


class EnvelopeError(ValueError):
    """A frame that is not a usable maim_message envelope; the message names the field and problem."""


def _segments(seg: Any, depth: int = 0, where: tuple = (), storable: bool = False) -> dict[str, Any]:
    """Check a segment tree (seglists nest) into plain dicts; unknown types are kept as they are.
    `storable`: the values are known to be storable (json_text_is_storable), only the shape is checked."""
    if depth > MAX_SEGMENT_DEPTH:
        raise EnvelopeError(f"segments nested deeper than {MAX_SEGMENT_DEPTH}")
    if not isinstance(seg, dict) or not isinstance(seg.get("type"), str) or not 0 < len(seg["type"]) <= 64:
        raise EnvelopeError(f"{_path(where)}: a segment is an object with a `type` string")
    kind, data = seg["type"], seg.get("data")
    if kind == "seglist":
        if not isinstance(data, list):
            raise EnvelopeError(f"{_path(where)}: a seglist's data must be a list of segments")
        return {
            "type": "seglist",
            "data": [_segments(c, depth + 1, (*where, i), storable) for i, c in enumerate(data)],
        }
    if not storable and (problem := _unstorable(data)):
        raise EnvelopeError(f"{_path(where)}.data: {problem}")
    return {"type": kind, "data": data}


def _unstorable(value: Any) -> str | None:
    """Why a value cannot be stored and read back (too deep, unencodable text), or None."""
    if isinstance(value, str):  # text and base64 media: the hot path
        return text_problem(value)
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if problem := text_problem(item):
                return problem
        elif isinstance(item, dict | list):
            if depth >= MAX_DATA_DEPTH:
                return f"nested deeper than {MAX_DATA_DEPTH} levels"
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
            if isinstance(item, dict):
                stack.extend((key, depth + 1) for key in item)
    return None


def _path(where: tuple) -> str:
    # Built only for an error message: the hot path passes index tuples.
    return "message_segment" + "".join(f".data.{i}" for i in where)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "(frame)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


class InboundMessage(BaseModel):
    """A parsed inbound chat message, ready for chat.ingest."""

    info: MessageInfo
    segments: list[dict[str, Any]]
    raw_message: str | None = None

    @property
    def is_group(self) -> bool:
        group = self.info.group_info
        return group is not None and bool(group.group_id)


def parse_envelope(frame: dict[str, Any], *, storable: bool = False) -> InboundMessage:
    """Validate a message frame. Raises EnvelopeError naming the first problems. `storable`: the frame
    was decoded from a JSON text that json_text_is_storable passed, so its values need no walk."""
    try:
        envelope = Envelope.model_validate(frame)
    except ValidationError as exc:
        raise EnvelopeError(_describe(exc)) from None
    top = _segments(envelope.message_segment, storable=storable)
    segments = top["data"] if top["type"] == "seglist" else [top]
    info = envelope.message_info
    if not storable and (problem := _unstorable(frame.get("message_info"))):
        raise EnvelopeError(f"message_info: {problem}")
    if not (info.group_info and info.group_info.group_id) and not (info.user_info and info.user_info.user_id):
        raise EnvelopeError("message_info: a private message needs user_info.user_id")
    # Everything is validated above; constructing without a second validation pass halves the cost.
    return InboundMessage.model_construct(info=info, segments=segments, raw_message=envelope.raw_message)


class CustomMessage(BaseModel):
    """A custom message from an adapter (`send_custom_message`): receipts, command results."""

    model_config = ConfigDict(extra="allow")
    platform: str | None = None
    message_type_name: str = Field(min_length=1, max_length=128)
    content: Any = None


def is_custom_message(frame: dict[str, Any]) -> bool:
    return bool(frame.get("is_custom_message")) or ("message_type_name" in frame and "message_info" not in frame)


def parse_custom(frame: dict[str, Any]) -> CustomMessage:
    try:
        custom = CustomMessage.model_validate(frame)
    except ValidationError as exc:
        raise EnvelopeError(_describe(exc)) from None
    if problem := _unstorable(custom.content):
        raise EnvelopeError(f"content: {problem}")
    return custom


# --- API-Server mode (maim_message's WebSocketClient, both 0.6.x and 0.7.x) --------------------------
API_STANDARD = "sys_std"
API_CUSTOM_PREFIX = "custom_"


class ApiPackage(_Lenient):
    """The package every API-Server frame travels in: `{ver, msg_id, type, meta, payload}`."""

    type: str = Field(min_length=1, max_length=128)
    msg_id: str | None = Field(default=None, max_length=256)
    payload: Any = None


def _api_envelope(payload: Any) -> dict[str, Any]:
    """An APIMessageBase dict as the legacy envelope our parser reads: who spoke is in
    message_info.sender_info (maim_message's MessageConverter.to_api_receive puts the legacy group_info /
    user_info there); message_dim (the client's key and platform) is not needed, the connection has
    both; APIMessageBase has no raw_message."""
    if not isinstance(payload, dict):
        raise EnvelopeError("payload: an APIMessageBase is an object")
    info = payload.get("message_info")
    if not isinstance(info, dict):
        raise EnvelopeError("payload.message_info: Field required")
    sender = info.get("sender_info")
    if isinstance(sender, dict):
        info = dict(info)
        for key in ("group_info", "user_info"):
            if info.get(key) is None and sender.get(key) is not None:
                info[key] = sender[key]
    return {"message_info": info, "message_segment": payload.get("message_segment")}


def parse_api_package(frame: dict[str, Any]) -> InboundMessage | CustomMessage | None:
    """An API-Server package: a chat message (`sys_std`), a custom message (`custom_<name>`, read as the
    legacy custom message `<name>`: `custom_message_id_echo` is a receipt), or None for the other system
    packages (`sys_ack` confirms a frame we sent reached the client, nothing more). Raises EnvelopeError."""
    try:
        package = ApiPackage.model_validate(frame)
    except ValidationError as exc:
        raise EnvelopeError(_describe(exc)) from None
    if package.type == API_STANDARD:
        return parse_envelope(_api_envelope(package.payload))
    if package.type.startswith(API_CUSTOM_PREFIX) and len(package.type) > len(API_CUSTOM_PREFIX):
        meta = frame.get("meta") if isinstance(frame.get("meta"), dict) else {}
        platform = meta.get("platform")
        return parse_custom(
            {
                "platform": platform if isinstance(platform, str) else None,
                "message_type_name": package.type[len(API_CUSTOM_PREFIX) :],
                "content": package.payload,
            }
        )
    if package.type.startswith("sys_"):
        return None
    raise EnvelopeError(f"type: unknown API-Server package type {package.type[:64]!r}")


# --- which platform a frame claims to come from -----------------------------------------------------


def _platform_of(value: Any) -> str | None:
    platform = value.get("platform") if isinstance(value, dict) else getattr(value, "platform", None)
    return platform if isinstance(platform, str) and platform else None


def claimed_platforms(frame: dict[str, Any], parsed: InboundMessage | CustomMessage, *, api_server: bool) -> set[str]:
    """Every platform a frame names for itself: a message's `message_info.platform` and the platforms of
    its `user_info` / `group_info`; a custom message's `platform`; in API-Server mode also the package's
    `meta.platform` and its payload's `message_dim.platform`. Empty or missing values name none. The
    gateway stores a frame as its connection's platform, and drops one that names another (a
    connection speaks for its own platform only)."""
    if isinstance(parsed, CustomMessage):
        named = [parsed.platform]
    else:
        info = parsed.info
        named = [info.platform, _platform_of(info.user_info), _platform_of(info.group_info)]
    if api_server:
        named.append(_platform_of(frame.get("meta")))
        payload = frame.get("payload")
        if isinstance(payload, dict):
            named.append(_platform_of(payload.get("message_dim")))
    return {p for p in named if p}
