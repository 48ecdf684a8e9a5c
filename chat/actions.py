"""The planner's own actions as tools: reply, no_reply and send_emoji (each one ends the cycle)."""

from __future__ import annotations

import base64
import re
from typing import Any

from django.db.models import F

from chat.components import ToolContext, error, ok, register_tool
from chat.components import ToolErrorCode as Code
from chat.models import Media, MediaKind, Message, SourceKind
from chat.services import message_send
from core.config import get_config
from core.text import is_blank, text_problem


def _outbound_extra(ctx: ToolContext) -> dict[str, Any]:
    extra: dict[str, Any] = {"tool_call_id": ctx.tool_call_id}
    if ctx.cycle is not None:
        extra["cycle_id"] = str(ctx.cycle.cycle_id)
    return extra


def _already_acted(ctx: ToolContext, what: str) -> dict[str, Any] | None:
    # One reply and one emoji per cycle: a model that calls reply twice would otherwise double-post.
    done = ctx.extra.setdefault("sent", set())
    if what in done:
        return error(Code.ALREADY_SENT, f"you already used {what} in this turn")
    return None


def reply(ctx: ToolContext, text: str, quote_message_id: str | int | None = None) -> dict[str, Any]:
    """Send a text message to this chat, optionally quoting a message by its id in the history."""
    if not isinstance(text, str) or is_blank(text):
        return error(Code.INVALID_ARGUMENT, "text must be a non-empty string")
    if problem := text_problem(text):
        return error(Code.INVALID_ARGUMENT, f"text {problem}")
    text = text.strip()
    # A chat message longer than this is not a chat message: the model is rambling or dumping data.
    limit = get_config().chat.max_reply_length
    if len(text) > limit:
        return error(Code.TEXT_TOO_LONG, f"text has {len(text)} characters; keep a chat message under {limit}")
    if refusal := _already_acted(ctx, "reply"):
        return refusal
    quote = ""
    payload: dict[str, Any] = {}
    if quote_message_id not in (None, ""):
        wanted = str(quote_message_id).lstrip("#")
        found = (
            Message.objects.filter(session=ctx.session, platform_message_id=wanted)
            .values_list("platform_message_id", flat=True)
            .first()
        )
        if found:
            quote = found
        else:
            # Sending unquoted beats making the model spend another call on a typo'd id.
            payload["quote_ignored"] = f"no message {wanted!r} in this chat"
    message = message_send(
        session=ctx.session,
        source_kind=SourceKind.REPLY,
        text=text,
        reply_to_platform_id=quote,
        extra=_outbound_extra(ctx),
    )
    ctx.extra["sent"].add("reply")
    return ok(message_id=str(message.uid), **payload)


def no_reply(ctx: ToolContext, reason: str = "") -> dict[str, Any]:
    """Stay silent this turn."""
    return ok(reason=str(reason or "")[:500])


_WORD = re.compile(r"[a-z0-9]+|[\u4e00-\u9fff]", re.IGNORECASE)


def _terms(text: str) -> set[str]:
    return {t.lower() for t in _WORD.findall(text or "")}


def emoji_choose(description: str) -> Media | None:
    """The stored emoji whose description and emotion best match; ties go to the least used."""
    wanted = _terms(description)
    best: tuple[int, int, int] | None = None
    chosen = None
    for media in Media.objects.filter(kind=MediaKind.EMOJI).only("id", "description", "emotion", "usage_count"):
        score = len(wanted & _terms(f"{media.description} {media.emotion}"))
        key = (score, -media.usage_count, -media.pk)
        if score and (best is None or key > best):
            best, chosen = key, media
    return chosen


def send_emoji(ctx: ToolContext, description: str) -> dict[str, Any]:
    """Send a stored emoji (sticker) matching the description."""
    if not isinstance(description, str) or not description.strip():
        return error(Code.INVALID_ARGUMENT, "description must be a non-empty string")
    if refusal := _already_acted(ctx, "send_emoji"):
        return refusal
    media = emoji_choose(description)
    if media is None:
        emojis = Media.objects.filter(kind=MediaKind.EMOJI).exclude(description="")
        known = list(emojis.values_list("description", flat=True)[:10])
        return error(Code.NO_MATCH, f"no stored emoji matches {description!r}; known emojis: {known}")
    try:
        with media.file.open("rb") as fh:
            data = base64.b64encode(fh.read()).decode()
    except OSError as exc:
        return error(Code.MEDIA_UNAVAILABLE, f"the emoji file cannot be read: {exc}")
    message_send(
        session=ctx.session,
        source_kind=SourceKind.REPLY,
        segments=[{"type": "emoji", "data": data}],
        text=f"[emoji: {media.description or media.sha256[:8]}]",
        extra={**_outbound_extra(ctx), "media_sha256": media.sha256},
    )
    Media.objects.filter(pk=media.pk).update(usage_count=F("usage_count") + 1)
    ctx.extra["sent"].add("send_emoji")
    return ok(emoji=media.description or media.sha256[:12])


def _has_emojis(ctx: ToolContext) -> bool:
    return Media.objects.filter(kind=MediaKind.EMOJI).exists()


register_tool(
    "reply",
    "Send a message to this chat now. Ends your turn.",
    reply,
    properties={
        "text": {"type": "string", "description": "What you say, as you would type it in the chat."},
        "quote_message_id": {
            "type": ["string", "null"],
            "description": "Optional: the id (#…) of a message in the history to quote.",
        },
    },
    required=["text"],
    ends_cycle=True,
)
register_tool(
    "no_reply",
    "Say nothing this time (nothing to add, not addressed, or you just spoke). Ends your turn.",
    no_reply,
    properties={"reason": {"type": "string", "description": "Why you stay silent (for your own record)."}},
    required=["reason"],
    ends_cycle=True,
)
register_tool(
    "send_emoji",
    "Send a sticker matching a short description (e.g. 'happy', '开心'). Ends your turn.",
    send_emoji,
    properties={"description": {"type": "string", "description": "The feeling or content wanted."}},
    required=["description"],
    available=_has_emojis,
    ends_cycle=True,
)
