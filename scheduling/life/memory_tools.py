"""The memory tools: remember / forget facts (memory slots) and keep scratch notes for the current task.

Memory slots are shown in every prompt (chat planner and life loop); scope `chat` (the default) keeps a
fact about this conversation, `global` one that holds everywhere. Scratch notes are working notes for
the task at hand in this chat: `note` adds one, `clear_notes` drops them all when the task is over.
"""

from __future__ import annotations

from typing import Any

from chat.components import ToolContext, error, ok, register_tool
from scheduling.life.error_codes import LifeError, MemoryErrorCode
from scheduling.life.memory import memory_slot_forget, memory_slot_set, scratch_note_add, scratch_notes_clear

_SCOPES = ("chat", "global")


def _scope_session(ctx: ToolContext, scope: Any):
    scope = scope or "chat"
    if scope not in _SCOPES:
        raise LifeError(MemoryErrorCode.INVALID_SCOPE, "scope is chat (this conversation) or global")
    return ctx.session if scope == "chat" else None


def remember(ctx: ToolContext, key: str, content: str, scope: str = "chat") -> dict[str, Any]:
    try:
        slot, created = memory_slot_set(
            key=key, content=content, session=_scope_session(ctx, scope), via="tool", tool_call_id=ctx.tool_call_id
        )
    except LifeError as exc:
        return error(exc.code, exc.message)
    return ok(key=slot.key, content=slot.content, scope=scope or "chat", created=created)


def forget(ctx: ToolContext, key: str, scope: str = "chat") -> dict[str, Any]:
    try:
        memory_slot_forget(key=key, session=_scope_session(ctx, scope))
    except LifeError as exc:
        return error(exc.code, exc.message)
    return ok(key=key.strip(), scope=scope or "chat", forgotten=True)


def note(ctx: ToolContext, text: str) -> dict[str, Any]:
    try:
        scratch_note_add(session=ctx.session, text=text, tool_call_id=ctx.tool_call_id)
    except LifeError as exc:
        return error(exc.code, exc.message)
    return ok(noted=True)


def clear_notes(ctx: ToolContext) -> dict[str, Any]:
    return ok(cleared=scratch_notes_clear(session=ctx.session))


_SCOPE_PARAM = {
    "type": "string",
    "enum": list(_SCOPES),
    "description": "chat: about this conversation (default); global: holds in every chat.",
    "default": "chat",
}

register_tool(
    "remember",
    "Keep a short fact under a key (e.g. birthday, favorite_food, 称呼); it appears in every later "
    "prompt. Writing an existing key replaces it.",
    remember,
    properties={
        "key": {"type": "string", "description": "A short name for the fact (one line, ≤ 64 characters)."},
        "content": {"type": "string", "description": "The fact itself, briefly."},
        "scope": _SCOPE_PARAM,
    },
    required=["key", "content"],
)
register_tool(
    "forget",
    "Drop a remembered fact by its key.",
    forget,
    properties={"key": {"type": "string", "description": "The fact's key."}, "scope": _SCOPE_PARAM},
    required=["key"],
)
register_tool(
    "note",
    "Add a scratch note for the task at hand in this chat (shown to you until cleared).",
    note,
    properties={"text": {"type": "string", "description": "The note."}},
    required=["text"],
)
register_tool("clear_notes", "Drop all scratch notes of this chat (the task is done).", clear_notes)
