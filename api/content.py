"""What an API request asks to send: its content validated and turned into maim_message segments.

Content types:
  * `text`: plain or markdown. QQ renders no markdown, so markdown is sent as written (the adapter
    has no markdown segment) and the format is recorded on the message.
  * `image`: base64 (stored in the media store, sent as an `image` segment) or an http(s) URL, sent
    as an `imageurl` segment for the adapter to fetch: this server never fetches URLs (no outbound
    internet is assumed, and fetching arbitrary URLs would be a request-forgery hole). Optional
    caption `text`, sent before the image.
  * `rich_text`: a list of segments: text, image (base64 or URL) and mention. The QQ adapter drops
    `at` segments, so a mention is sent as the text "@name" (name defaults to the user id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from api.errors import ApiError, ApiErrorCode
from chat.media import MediaError, decode_base64, media_store, sniff_mime
from core.config import get_config
from core.text import is_blank

Code = ApiErrorCode

CONTENT_TYPES = ("text", "rich_text", "image")
TEXT_FORMATS = ("plain", "markdown")
SEGMENT_TYPES = ("text", "image", "mention")
MAX_SEGMENTS = 50
MAX_URL_LENGTH = 2048


@dataclass
class Content:
    """A request's content as the send service needs it, plus what to record about it."""

    type: str
    format: str
    message_text: str
    segments: list[dict[str, Any]] = field(default_factory=list)
    media: list[str] = field(default_factory=list)


def _image_segment(*, base64_data: str | None, url: str | None, fld: str, content: Content) -> dict[str, Any]:
    given = [name for name, value in (("base64", base64_data), ("url", url)) if value]
    if len(given) != 1:
        raise ApiError(Code.INVALID_IMAGE, "give the image as exactly one of base64 or url", field=fld)
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or len(url) > MAX_URL_LENGTH:
            raise ApiError(
                Code.INVALID_IMAGE, f"url must be an http(s) URL of at most {MAX_URL_LENGTH} characters", field=fld
            )
        return {"type": "imageurl", "data": url}
    limit = get_config().api.max_image_bytes
    # Reject by the encoded size first: decoding a huge payload only to refuse it wastes memory.
    if len(base64_data) > limit * 4 // 3 + 8:
        raise ApiError(Code.IMAGE_TOO_LARGE, f"the image is larger than {limit} bytes", field=f"{fld}.base64")
    try:
        data = decode_base64(base64_data.strip())
    except MediaError as exc:
        raise ApiError(Code.INVALID_IMAGE, f"image base64: {exc}", field=f"{fld}.base64") from None
    if len(data) > limit:
        raise ApiError(Code.IMAGE_TOO_LARGE, f"the image is larger than {limit} bytes", field=f"{fld}.base64")
    if not sniff_mime(data).startswith("image/"):
        raise ApiError(Code.INVALID_IMAGE, "the data is not a PNG, JPEG, GIF or WebP image", field=f"{fld}.base64")
    media = media_store(data=data, kind="image")
    content.media.append(media.sha256)
    # A reference to the stored media, as inbound media is kept: the outbox (chat.outbox) puts the
    # bytes on the wire as the bare base64 adapters expect, and rows stay small.
    return {"type": "image", "data": {"media": media.sha256}}


def _reject_extra(fld: str, given: Any, *, for_type: str) -> None:
    if given not in (None, "", []):
        raise ApiError(Code.INVALID_CONTENT, f"{fld} is not used with type {for_type!r}", field=fld)


def content_build(
    *,
    type: str,
    text: str | None = None,
    format: str = "plain",
    segments: list[dict[str, Any]] | None = None,
    image: dict[str, Any] | None = None,
) -> Content:
    """Validate a request's content and turn it into maim_message segments (media stored)."""
    max_len = get_config().api.max_text_length
    if type not in CONTENT_TYPES:
        raise ApiError(Code.INVALID_CONTENT, f"type must be one of {', '.join(CONTENT_TYPES)}", field="type")
    if format not in TEXT_FORMATS:
        raise ApiError(Code.INVALID_CONTENT, f"format must be one of {', '.join(TEXT_FORMATS)}", field="format")
    if format != "plain" and type != "text":
        raise ApiError(Code.INVALID_CONTENT, "format applies to type 'text' only", field="format")
    text = (text or "").strip()
    if len(text) > max_len:
        raise ApiError(Code.TEXT_TOO_LONG, f"text has {len(text)} characters; the limit is {max_len}", field="text")
    content = Content(type=type, format=format, message_text=text)

    if type == "text":
        _reject_extra("segments", segments, for_type=type)
        _reject_extra("image", image, for_type=type)
        if is_blank(text):
            raise ApiError(Code.EMPTY_TEXT, "text is empty", field="text")
        return content

    if type == "image":
        _reject_extra("segments", segments, for_type=type)
        if not image:
            raise ApiError(Code.INVALID_CONTENT, "type 'image' needs image", field="image")
        seg = _image_segment(base64_data=image.get("base64"), url=image.get("url"), fld="image", content=content)
        content.segments = ([{"type": "text", "data": text}] if text else []) + [seg]
        return content

    return _rich_text(content, segments=segments, text=text, image=image, max_len=max_len)


def _rich_text(
    content: Content,
    *,
    segments: list[dict[str, Any]] | None,
    text: str,
    image: dict[str, Any] | None,
    max_len: int,
) -> Content:
    """A rich_text request's segments: text, mention (as "@name" text) and image, checked one by one."""
    _reject_extra("text", text, for_type=content.type)
    _reject_extra("image", image, for_type=content.type)
    if not segments:
        raise ApiError(Code.INVALID_CONTENT, "type 'rich_text' needs a non-empty segments list", field="segments")
    if len(segments) > MAX_SEGMENTS:
        raise ApiError(Code.INVALID_CONTENT, f"at most {MAX_SEGMENTS} segments", field="segments")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, seg in enumerate(segments):
        fld = f"segments[{i}]"
        kind = seg.get("type")
        if kind == "text":
            value = seg.get("text") or ""
            if is_blank(value):
                raise ApiError(Code.EMPTY_TEXT, "a text segment needs text", field=f"{fld}.text")
            out.append({"type": "text", "data": value})
            texts.append(value)
        elif kind == "mention":
            user_id = str(seg.get("user_id") or "").strip()
            if not user_id:
                raise ApiError(Code.INVALID_CONTENT, "a mention needs user_id", field=f"{fld}.user_id")
            value = f"@{(seg.get('name') or '').strip() or user_id} "
            out.append({"type": "text", "data": value})
            texts.append(value)
        elif kind == "image":
            out.append(_image_segment(base64_data=seg.get("base64"), url=seg.get("url"), fld=fld, content=content))
        else:
            raise ApiError(
                Code.INVALID_CONTENT, f"segment type must be one of {', '.join(SEGMENT_TYPES)}", field=f"{fld}.type"
            )
    joined = "".join(texts).strip()
    if len(joined) > max_len:
        raise ApiError(
            Code.TEXT_TOO_LONG,
            f"the segments' text has {len(joined)} characters; the limit is {max_len}",
            field="segments",
        )
    content.segments = out
    content.message_text = joined
    return content
