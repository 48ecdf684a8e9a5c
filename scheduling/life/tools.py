"""The timer tools: set, list and cancel timers that wake the bot's life loop for the current chat."""

from __future__ import annotations

from typing import Any

from chat.components import ToolContext, error, ok, register_tool
from scheduling.life.error_codes import LifeError, TimerErrorCode
from scheduling.life.timers import timer_as_dict, timer_cancel, timer_create, timers_active
from scheduling.models import Actor
from scheduling.services import ActedBy


def _acted_by(ctx: ToolContext) -> ActedBy:
    return ActedBy(via=Actor.TOOL, tool_call_id=ctx.tool_call_id)


def set_timer(ctx: ToolContext, spec: str, label: str, payload: str = "") -> dict[str, Any]:
    """Set a timer bound to this chat; when it fires, the life loop decides what to do."""
    if payload is None:
        payload = ""
    if not isinstance(payload, str):
        return error(TimerErrorCode.INVALID_ARGUMENT, "payload must be text")
    try:
        timer = timer_create(spec=spec, label=label, payload=payload, session=ctx.session, acted_by=_acted_by(ctx))
    except LifeError as exc:
        return error(exc.code, exc.message)
    return ok(session_id=ctx.session.session_id, **timer_as_dict(timer))


def list_timers(ctx: ToolContext) -> dict[str, Any]:
    """This chat's active timers, soonest first."""
    timers = [timer_as_dict(t) for t in timers_active(session=ctx.session)]
    return ok(session_id=ctx.session.session_id, timers=timers)


def cancel_timer(ctx: ToolContext, timer_id: str) -> dict[str, Any]:
    """Cancel one of this chat's active timers."""
    if not isinstance(timer_id, str) or not timer_id.strip():
        return error(TimerErrorCode.INVALID_ARGUMENT, "timer_id is required, e.g. tm_k3v9xq2mtr")
    try:
        timer = timer_cancel(timer_id=timer_id.strip(), session=ctx.session, acted_by=_acted_by(ctx))
    except LifeError as exc:
        return error(exc.code, exc.message)
    return ok(session_id=ctx.session.session_id, cancelled_timer_id=timer.pk)


register_tool(
    "set_timer",
    "Set a timer for this chat. When it fires you are woken (without this conversation) to decide "
    "what to do: send a message, update your inner state or nothing. spec: a delay fires once "
    "(30s, 5min, 2h, 1d, 1h30min, 5分钟, 2小时); every:<delay> repeats (every:1h, 每2小时); "
    "once:YYYY-MM-DD HH:MM in the bot's time zone; cron:<5 fields> repeats (cron:0 8 * * *). "
    "A payload starting with say: is sent to this chat exactly as written.",
    set_timer,
    properties={
        "spec": {
            "type": "string",
            "description": "When: 5min, every:1h, once:2026-04-10 09:00, cron:0 8 * * *",
        },
        "label": {"type": "string", "description": "What the timer is for, in a few words."},
        "payload": {
            "type": "string",
            "description": "Details for your future self; or say:<text> to send <text> as written.",
            "default": "",
        },
    },
    required=["spec", "label"],
)
register_tool("list_timers", "List this chat's active timers.", list_timers)
register_tool(
    "cancel_timer",
    "Cancel one of this chat's active timers by timer_id.",
    cancel_timer,
    properties={"timer_id": {"type": "string", "description": "The timer to cancel (tm_...)."}},
    required=["timer_id"],
)
