"""The life loop's own tools (scope "life", offered only to life-loop turns): send_message,
update_inner_state, do_nothing. A turn puts its timer and firing in ToolContext.extra."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from chat.components import LIFE, ToolContext, error, ok, register_tool
from chat.models import ChatSession, SourceKind
from chat.services import message_send
from core.config import get_config
from core.text import is_blank, text_problem
from scheduling.life.error_codes import LifeError
from scheduling.life.error_codes import LifeToolErrorCode as Code
from scheduling.life.memory import inner_state_update

# Defaults rather than required parameters: a missing text is the tool's own, telling refusal.


def send_message(ctx: ToolContext, text: Any = None, session: Any = None) -> dict[str, Any]:
    """Send a message to the timer's chat, or to the chat whose session_id is `session`."""
    timer, firing = ctx.extra["timer"], ctx.extra["firing"]
    if not isinstance(text, str) or is_blank(text):
        return error(Code.EMPTY_TEXT, "text is empty")
    if problem := text_problem(text):
        return error(Code.INVALID_ARGUMENT, f"text {problem}")
    limit = get_config().scheduling.max_text_length
    if len(text) > limit:
        return error(Code.TEXT_TOO_LONG, f"text has {len(text)} characters; the limit is {limit}")
    if session is not None and not isinstance(session, str):
        return error(Code.INVALID_ARGUMENT, "session must be a session_id string")
    if session:
        target = ChatSession.objects.filter(session_id=session.strip()).first()
        if target is None:
            return error(Code.UNKNOWN_SESSION, f"no chat with session_id {session!r}")
    else:
        target = timer.session
        if target is None:
            return error(Code.NO_SESSION, "this timer has no chat; give `session`")
    with transaction.atomic():
        message = message_send(
            session=target,
            source_kind=SourceKind.TIMER,
            text=text.strip(),
            extra={"timer_id": timer.pk, "firing_id": firing.pk, "cycle_id": str(ctx.cycle.cycle_id)},
        )
    ctx.extra.setdefault("sent_message_ids", []).append(message.pk)
    return ok(message_id=str(message.uid), session_id=target.session_id)


def update_inner_state(ctx: ToolContext, text: Any = None) -> dict[str, Any]:
    """Replace the bot's inner state (its history is kept)."""
    if not isinstance(text, str):
        return error(Code.INVALID_ARGUMENT, "text must be a string")
    try:
        inner_state_update(text=text, via="life", cycle=ctx.cycle, tool_call_id=ctx.tool_call_id)
    except LifeError as exc:
        return error(exc.code, exc.message)
    return ok()


def do_nothing(ctx: ToolContext, reason: Any = "") -> dict[str, Any]:
    """Decide that nothing needs doing now."""
    return ok(reason=str(reason or "")[:500])


register_tool(
    "send_message",
    "Send a message to a chat: the timer's chat unless `session` names another (a session_id).",
    send_message,
    properties={
        "text": {"type": "string", "description": "The message, as the person will read it."},
        "session": {
            "type": ["string", "null"],
            "description": "session_id of another chat; omit for the timer's chat.",
        },
    },
    required=["text"],
    scopes=frozenset({LIFE}),
)
register_tool(
    "update_inner_state",
    "Replace your inner state: your own note about your current situation, mood and plans.",
    update_inner_state,
    properties={"text": {"type": "string", "description": "The whole new inner state."}},
    required=["text"],
    scopes=frozenset({LIFE}),
)
register_tool(
    "do_nothing",
    "Decide that nothing needs doing now.",
    do_nothing,
    properties={"reason": {"type": "string", "description": "Why, in a few words."}},
    required=["reason"],
    scopes=frozenset({LIFE}),
)
