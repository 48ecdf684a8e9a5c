"""The model's memory: the inner state (with its revisions), memory slots, per-chat rolling summaries
and scratch notes — their writes, and the context blocks that put them in the planner's prompt."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from chat.models import ChatSession, Direction, Message
from core.aio import db
from core.config import get_config
from scheduling.life.error_codes import LifeError, MemoryErrorCode
from scheduling.life.models import InnerState, InnerStateRevision, MemorySlot, ScratchNote, SessionSummary

logger = logging.getLogger(__name__)

Code = MemoryErrorCode

# --- inner state ----------------------------------------------------------------------------------


def inner_state_get() -> InnerState:
    state, _ = InnerState.objects.get_or_create(pk=1)
    return state


def inner_state_update(
    *,
    text: str,
    via: str,
    user: Any = None,
    cycle: Any = None,
    tool_call_id: str = "",
    now: datetime | None = None,
) -> InnerState:
    """Replace the inner state, keeping the change (old and new text, who, when) as a revision.

    `via` is life (the life loop's update_inner_state), operator (the admin) or system."""
    limit = get_config().life.inner_state_max_length
    if not isinstance(text, str):
        raise LifeError(Code.TEXT_TOO_LONG, "the inner state must be text")
    text = text.strip()
    if len(text) > limit:
        raise LifeError(Code.TEXT_TOO_LONG, f"the inner state has {len(text)} characters; the limit is {limit}")
    now = now or timezone.now()
    who = f"{via}:{user.get_username()}" if user is not None else via
    with transaction.atomic():
        inner_state_get()
        state = InnerState.objects.select_for_update().get(pk=1)
        InnerStateRevision.objects.create(
            text=text,
            previous_text=state.text,
            created_at=now,
            via=via,
            user=user,
            cycle=cycle,
            tool_call_id=tool_call_id,
        )
        state.text = text
        state.updated_at = now
        state.updated_by = who[:160]
        state.save()
    return state


# --- memory slots ---------------------------------------------------------------------------------

_KEY = re.compile(r"^[^\s][^\r\n\t]{0,63}$")


def _clean_key(key: Any) -> str:
    key = key.strip() if isinstance(key, str) else ""
    if not key or not _KEY.match(key):
        raise LifeError(Code.INVALID_KEY, "a memory key is 1 to 64 characters on one line, e.g. favorite_food or 生日")
    return key


def memory_slot_set(
    *, key: str, content: str, session: ChatSession | None = None, via: str = "tool", tool_call_id: str = ""
) -> tuple[MemorySlot, bool]:
    """Write a fact under `key` (global when session is None); an existing key is overwritten.
    Returns (slot, created). A new key beyond the per-scope limit is refused with memory_full."""
    cfg = get_config().life
    key = _clean_key(key)
    content = content.strip() if isinstance(content, str) else ""
    if not content:
        raise LifeError(Code.EMPTY_CONTENT, "nothing to remember: content is empty")
    if len(content) > cfg.memory_max_content_length:
        raise LifeError(
            Code.CONTENT_TOO_LONG,
            f"content has {len(content)} characters; the limit is {cfg.memory_max_content_length}",
        )
    scope = "this chat" if session is not None else "global memory"
    try:
        with transaction.atomic():
            if session is not None:
                # Serialize writers of one chat so two concurrent remembers cannot both take the last slot.
                ChatSession.objects.select_for_update().filter(pk=session.pk).first()
            slots = MemorySlot.objects.filter(session=session)
            slot = slots.filter(key=key).first()
            if slot is None:
                if slots.count() >= cfg.memory_max_slots:
                    raise LifeError(
                        Code.MEMORY_FULL,
                        f"{scope} already holds {cfg.memory_max_slots} facts; forget one first",
                    )
                slot = MemorySlot(session=session, key=key)
                created = True
            else:
                created = False
            slot.content = content
            slot.updated_via = via
            slot.updated_by_tool_call_id = tool_call_id
            slot.save()
    except IntegrityError:
        # The same key written concurrently: the other writer won; write over it.
        slot = MemorySlot.objects.get(session=session, key=key)
        MemorySlot.objects.filter(pk=slot.pk).update(content=content, updated_at=timezone.now())
        slot.refresh_from_db()
        created = False
    return slot, created


def memory_slot_forget(*, key: str, session: ChatSession | None = None) -> None:
    key = _clean_key(key)
    deleted, _ = MemorySlot.objects.filter(session=session, key=key).delete()
    if not deleted:
        scope = "this chat" if session is not None else "global memory"
        raise LifeError(Code.NOT_FOUND, f"no memory {key!r} in {scope}")


def memory_slots_for(session: ChatSession | None) -> tuple[list[MemorySlot], list[MemorySlot]]:
    """(global slots, this chat's slots)."""
    # One query for both lists: this runs on every planner cycle (memory context block).
    scope = Q(session__isnull=True) if session is None else Q(session__isnull=True) | Q(session=session)
    slots = list(MemorySlot.objects.filter(scope).order_by("key"))
    global_slots = [s for s in slots if s.session_id is None]
    own = [s for s in slots if s.session_id is not None]
    return global_slots, own


# --- scratch notes --------------------------------------------------------------------------------


def scratch_note_add(*, session: ChatSession, text: str, tool_call_id: str = "") -> ScratchNote:
    text = text.strip() if isinstance(text, str) else ""
    if not text:
        raise LifeError(Code.EMPTY_CONTENT, "the note is empty")
    limit = get_config().life.memory_max_content_length * 4
    if len(text) > limit:
        raise LifeError(Code.CONTENT_TOO_LONG, f"the note has {len(text)} characters; the limit is {limit}")
    return ScratchNote.objects.create(session=session, text=text, tool_call_id=tool_call_id)


def scratch_notes_clear(*, session: ChatSession) -> int:
    deleted, _ = ScratchNote.objects.filter(session=session).delete()
    return deleted


# --- rolling summaries ----------------------------------------------------------------------------

SUMMARY_PROMPT = (
    "You keep the running summary of a chat for your future self: who is in it, what was discussed, "
    "what was decided or promised, open questions. Merge the previous summary with the new messages. "
    "Write at most 15 short lines in the language of the chat. Answer with the summary only."
)
# A refresh requested but not done within this time may be requested again (lost task, failed call).
_REQUEST_GRACE = timedelta(minutes=10)


def summary_refresh_due(session_pks: list[int], *, now: datetime | None = None) -> list[int]:
    """The sessions with enough new messages since their summary; marks them requested. Cheap: one
    bounded count per session, nothing when summaries are off."""
    every = get_config().life.summary_every_messages
    if not every:
        return []
    now = now or timezone.now()
    due = []
    for pk in set(session_pks):
        summary, _ = SessionSummary.objects.get_or_create(session_id=pk)
        if summary.refresh_requested_at and now - summary.refresh_requested_at < _REQUEST_GRACE:
            continue
        # Counting stops at `every`: a chat whose summaries keep failing must not cost a scan of its
        # whole history on every check.
        new = (
            Message.objects.filter(session_id=pk, id__gt=summary.last_message_id)
            .order_by()
            .values("id")[:every]
            .count()
        )
        if new < every:
            continue
        if SessionSummary.objects.filter(pk=summary.pk, refresh_requested_at=summary.refresh_requested_at).update(
            refresh_requested_at=now
        ):
            due.append(pk)
    return due


def summary_request(session_pks: list[int]) -> list[int]:
    """Enqueue a summary refresh (django-q2 task) for every session that needs one."""
    from django_q.tasks import async_task

    due = summary_refresh_due(session_pks)
    for pk in due:
        async_task("scheduling.life.memory.summary_refresh", pk, group="summary", task_name=f"summary-{pk}")
    return due


def _render_messages(messages: list[Message]) -> str:
    tz = get_config().tzinfo
    lines = []
    for m in messages:
        who = "bot" if m.direction == Direction.OUT else (m.sender_nickname or m.sender_id or "user")
        lines.append(f"[{m.time.astimezone(tz):%m-%d %H:%M}] {who}: {m.text}")
    return "\n".join(lines)


def summary_refresh(session_pk: int) -> str:
    """django-q2 task: fold a chat's new messages into its summary (one LLM call, purpose summary,
    with the sync client: this runs in a worker)."""
    from chat.agent.llm import complete_sync

    if get_config().offline:
        SessionSummary.objects.filter(session_id=session_pk).update(refresh_requested_at=None)
        return "offline"
    cfg = get_config().life
    summary, _ = SessionSummary.objects.get_or_create(session_id=session_pk)
    new = list(
        Message.objects.filter(session_id=session_pk, id__gt=summary.last_message_id).order_by("id")[
            : cfg.summary_max_messages
        ]
    )
    if not new:
        return "nothing new"
    user = f"Previous summary:\n{summary.text or '(none yet)'}\n\nNew messages:\n{_render_messages(new)}"
    result = complete_sync(
        purpose="summary",
        messages=[{"role": "system", "content": SUMMARY_PROMPT}, {"role": "user", "content": user}],
        session_id=session_pk,
    )
    if result.budget_exceeded:
        # The summary waits: the request stays, and the next check after the reset refreshes it.
        logger.info("summary of session %s waits: %s", session_pk, result.budget_exceeded)
        return f"waiting: {result.budget_exceeded}"
    if not result.ok or not result.content.strip():
        SessionSummary.objects.filter(pk=summary.pk).update(
            error=result.error or "empty answer", refresh_requested_at=None
        )
        return f"failed: {result.error or 'empty answer'}"
    # Only if no other refresh moved the summary meanwhile.
    updated = SessionSummary.objects.filter(pk=summary.pk, last_message_id=summary.last_message_id).update(
        text=result.content.strip(),
        last_message_id=new[-1].pk,
        refreshed_at=timezone.now(),
        refresh_requested_at=None,
        error="",
    )
    return "refreshed" if updated else "superseded"


_background: set[asyncio.Task] = set()

# Inbound messages seen by this process per session since its last summary check. The check costs a few
# queries in the gateway writer's thread-sensitive executor, so it only runs once a session has gathered
# `summary_every_messages` new messages here (messages stored before a restart are counted by the check
# itself when it runs, so at most one interval is added after a restart).
_unchecked: dict[int, int] = {}
_unchecked_lock = threading.Lock()


def _sessions_to_check(messages: list[Message], every: int) -> list[int]:
    with _unchecked_lock:
        for m in messages:
            _unchecked[m.session_id] = _unchecked.get(m.session_id, 0) + 1
        ready = [pk for pk, n in _unchecked.items() if n >= every]
        for pk in ready:
            del _unchecked[pk]
    return ready


def on_inbound_stored(sender: Any, messages: list[Message], **kwargs: Any) -> None:
    """inbound_stored receiver: request summaries when chats have grown. Never blocks an event loop."""
    every = get_config().life.summary_every_messages
    if not every:
        return
    session_pks = _sessions_to_check(messages, every)
    if not session_pks:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:
        summary_request(session_pks)
        return
    task = loop.create_task(db(summary_request)(session_pks))
    _background.add(task)
    task.add_done_callback(_background.discard)


# --- context blocks (the chat planner's prompt; the life loop renders the same text) --------------


def inner_state_text() -> str:
    return InnerState.objects.filter(pk=1).values_list("text", flat=True).first() or ""


def inner_state_block(session: ChatSession | None = None) -> str:
    text = inner_state_text()
    if not text:
        return ""
    return f"## Your inner state (read-only here; the life loop keeps it)\n{text}"


def memory_block(session: ChatSession | None) -> str:
    global_slots, own = memory_slots_for(session)
    if not global_slots and not own:
        return ""
    lines = ["## Memory (remember / forget manage it)"]
    if global_slots:
        lines.append("Global:")
        lines += [f"- {s.key}: {s.content}" for s in global_slots]
    if own:
        lines.append("About this chat:")
        lines += [f"- {s.key}: {s.content}" for s in own]
    return "\n".join(lines)


def summary_block(session: ChatSession | None) -> str:
    if session is None:
        return ""
    text = SessionSummary.objects.filter(session=session).values_list("text", flat=True).first()
    return f"## Summary of this conversation so far\n{text}" if text else ""


def scratch_block(session: ChatSession | None) -> str:
    shown = get_config().life.scratch_notes_shown
    if session is None or not shown:
        return ""
    notes = list(ScratchNote.objects.filter(session=session).order_by("-created_at", "-id")[:shown])
    if not notes:
        return ""
    lines = ["## Your scratch notes for the current task (note / clear_notes)"]
    lines += [f"- {n.text}" for n in reversed(notes)]
    return "\n".join(lines)


def register_context_blocks() -> None:
    from chat.components import register_context_block

    register_context_block("inner_state", inner_state_block, order=10)
    register_context_block("memory", memory_block, order=20)
    register_context_block("summary", summary_block, order=30)
    register_context_block("scratch", scratch_block, order=40)
