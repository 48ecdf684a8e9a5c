"""The scheduling tools: schedule, cancel and list private messages for the current chat."""

from __future__ import annotations

from typing import Any

from chat.components import ToolContext, ToolErrorCode, error, ok, register_tool
from scheduling.error_codes import SchedulingError, SchedulingErrorCode
from scheduling.models import Actor
from scheduling.services import (
    ActedBy,
    scheduled_message_as_dict,
    scheduled_message_cancel,
    scheduled_message_create,
    scheduled_messages_pending,
)


def _acted_by(ctx: ToolContext) -> ActedBy:
    return ActedBy(via=Actor.TOOL, tool_call_id=ctx.tool_call_id)


def _private_only(ctx: ToolContext) -> dict[str, Any] | None:
    if not ctx.session.is_private:
        return error(SchedulingErrorCode.NOT_PRIVATE_CHAT, "scheduled messages are for private chats only")
    return None


def schedule_private_message(
    ctx: ToolContext, send_at: str, message_text: str, replace_existing: bool = False
) -> dict[str, Any]:
    """Write a message now; it is sent as written at send_at, with no further thought."""
    if refusal := _private_only(ctx):
        return refusal
    if not isinstance(replace_existing, bool):
        return error(ToolErrorCode.INVALID_ARGUMENT, "replace_existing must be true or false")
    try:
        result = scheduled_message_create(
            session=ctx.session,
            send_at=send_at,
            message_text=message_text,
            replace_existing=replace_existing,
            acted_by=_acted_by(ctx),
        )
    except SchedulingError as exc:
        return error(exc.code, exc.message)
    payload = scheduled_message_as_dict(result.task)
    payload.pop("status")
    if result.cancelled_ids:
        payload["cancelled_task_ids"] = result.cancelled_ids
    return ok(**payload)


def cancel_scheduled_private_message(ctx: ToolContext, task_id: str | None = None) -> dict[str, Any]:
    """Cancel one pending scheduled message of this chat, or all of them when task_id is None."""
    if refusal := _private_only(ctx):
        return refusal
    try:
        cancelled = scheduled_message_cancel(
            session=ctx.session,
            task_ids=[task_id] if task_id else None,
            acted_by=_acted_by(ctx),
            reason="cancelled by the planner",
        )
    except SchedulingError as exc:
        return error(exc.code, exc.message)
    return ok(session_id=ctx.session.session_id, cancelled_task_ids=cancelled)


def list_scheduled_private_messages(ctx: ToolContext) -> dict[str, Any]:
    """The pending scheduled messages of this chat, soonest first."""
    if refusal := _private_only(ctx):
        return refusal
    tasks = [scheduled_message_as_dict(t) for t in scheduled_messages_pending(session=ctx.session)]
    return ok(session_id=ctx.session.session_id, tasks=tasks)


def _private(ctx: ToolContext) -> bool:
    return ctx.session.is_private


register_tool(
    "schedule_private_message",
    "Schedule a private message to this person. Write the final text now: at send_at it is "
    "sent exactly as written, without asking you again. Use for reminders and promised "
    "follow-ups.",
    schedule_private_message,
    properties={
        "send_at": {
            "type": "string",
            "description": "When to send, ISO 8601. With an offset it is that instant; without "
            "one it is read in the bot's time zone. Must be in the future.",
        },
        "message_text": {"type": "string", "description": "The exact text to send."},
        "replace_existing": {
            "type": "boolean",
            "description": "Cancel this chat's other pending scheduled messages first.",
            "default": False,
        },
    },
    required=["send_at", "message_text"],
    available=_private,
)
register_tool(
    "cancel_scheduled_private_message",
    "Cancel a pending scheduled message of this chat by task_id, or all of them when omitted.",
    cancel_scheduled_private_message,
    properties={"task_id": {"type": ["string", "null"], "description": "The task to cancel; omit for all."}},
    available=_private,
)
register_tool(
    "list_scheduled_private_messages",
    "List this chat's pending scheduled messages.",
    list_scheduled_private_messages,
    available=_private,
)
